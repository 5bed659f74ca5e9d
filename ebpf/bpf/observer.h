/* Types shared by the BPF programs (observer.bpf.c) and the Rust loader (src/bpf_abi.rs).
 * Every field is a fixed-width integer, laid out without implicit padding, so the Rust
 * side can mirror it with #[repr(C)]. Change both files together. */
#ifndef NBOS_OBSERVER_H
#define NBOS_OBSERVER_H

#define NBOS_COMM_LEN 16

/* What a probed entry point does; the low byte of the attach cookie. */
enum nbos_call_kind {
	NBOS_CALL_LAUNCH = 1,
	NBOS_CALL_COPY = 2,
	NBOS_CALL_MEMSET = 3,
	NBOS_CALL_SYNC = 4,
};

/* Where the byte count lives; the second byte of the attach cookie. */
enum nbos_bytes_from {
	NBOS_BYTES_NONE = 0,
	/* 1..6: the n-th integer argument (x86-64 SysV / AArch64 AAPCS registers). */
	NBOS_BYTES_MEMCPY2D = 0x10, /* WidthInBytes * Height of the CUDA_MEMCPY2D at arg 1 */
	NBOS_BYTES_MEMCPY3D = 0x11, /* WidthInBytes * Height * Depth of the CUDA_MEMCPY3D at arg 1 */
	NBOS_BYTES_2D_ARGS45 = 0x12, /* arg 4 (width) * arg 5 (height): cuMemsetD2D* */
};
/* The third byte of the cookie: element size multiplier for memsets (0 means 1). */

/* Per-process (tgid) GPU activity, the value of the `activity` map. */
struct nbos_activity {
	__u64 launches;
	__u64 copies;
	__u64 copy_bytes;
	__u64 memsets;
	__u64 memset_bytes;
	__u64 syncs;
	__u64 driver_ioctls; /* ioctls on watched GPU device files (sys_enter, optional) */
	__u64 first_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 last_ns;
	char comm[NBOS_COMM_LEN];
};

/* Sent on the `exits` ring buffer when the last thread of a tracked or watched process exits. */
struct nbos_exit_event {
	__u32 tgid;
	__s32 exit_code;
	__u64 exit_ns;
	__u32 had_activity;
	__u32 pad;
	struct nbos_activity activity; /* final counts (zero when had_activity == 0) */
};

#endif
