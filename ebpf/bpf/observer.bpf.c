// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Per-process GPU activity from uprobes on the CUDA driver's work-submitting entry points,
 * and process exit from the sched_process_exit tracepoint.
 *
 * One uprobe program serves every entry point: the loader attaches it to each symbol with a
 * cookie (bpf_get_attach_cookie) saying what the call is and where its byte count lives, so a
 * new entry point is a line in the Rust symbol table, not a new program. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "observer.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Sized from user space (EbpfLoader::set_max_entries); this is the default. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct nbos_activity);
} activity SEC(".maps");

/* Processes whose exit the daemon wants to hear of even without GPU activity (kernel processes). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} watched SEC(".maps");

/* Device numbers (kernel dev_t: major << 20 | minor) whose ioctls count as GPU activity:
 * /dev/nvidia*, filled by user space. Empty unless the ioctl probe is enabled. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} gpu_devices SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} exits SEC(".maps");

/* Exit events lost because the ring buffer was full (user space fell behind); summed over CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} exit_drops SEC(".maps");

static __always_inline struct nbos_activity *activity_of(__u32 tgid, __u64 now)
{
	struct nbos_activity *a = bpf_map_lookup_elem(&activity, &tgid);
	if (a)
		return a;
	/* BPF_NOEXIST: two threads of one process may race here; the loser's insert fails and
	 * both then update the winner's entry. */
	struct nbos_activity zero = {};
	bpf_map_update_elem(&activity, &tgid, &zero, BPF_NOEXIST);
	a = bpf_map_lookup_elem(&activity, &tgid);
	if (!a)
		return 0; /* map full: the process goes uncounted rather than evicting another */
	if (a->first_ns == 0) {
		a->first_ns = now;
		bpf_get_current_comm(a->comm, sizeof(a->comm));
	}
	return a;
}

static __always_inline __u64 user_u64(const void *base, __u64 offset)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (const char *)base + offset))
		return 0;
	return v;
}

/* Field offsets in the CUDA driver API's structs (cuda.h, 64-bit; stable ABI since CUDA 3.2):
 * CUDA_MEMCPY2D has 14 eight-byte slots before WidthInBytes, CUDA_MEMCPY3D 22 (its size is 200).
 * src/bpf_abi.rs checks these numbers against #[repr(C)] mirrors of the two structs. */
#define MEMCPY2D_WIDTH_IN_BYTES 112
#define MEMCPY2D_HEIGHT 120
#define MEMCPY3D_WIDTH_IN_BYTES 176
#define MEMCPY3D_HEIGHT 184
#define MEMCPY3D_DEPTH 192

static __always_inline __u64 bytes_of(struct pt_regs *ctx, __u32 from)
{
	switch (from) {
	case 1: return PT_REGS_PARM1(ctx);
	case 2: return PT_REGS_PARM2(ctx);
	case 3: return PT_REGS_PARM3(ctx);
	case 4: return PT_REGS_PARM4(ctx);
	case 5: return PT_REGS_PARM5(ctx);
	case NBOS_BYTES_MEMCPY2D: {
		const void *p = (const void *)PT_REGS_PARM1(ctx);
		return user_u64(p, MEMCPY2D_WIDTH_IN_BYTES) * user_u64(p, MEMCPY2D_HEIGHT);
	}
	case NBOS_BYTES_MEMCPY3D: {
		const void *p = (const void *)PT_REGS_PARM1(ctx);
		return user_u64(p, MEMCPY3D_WIDTH_IN_BYTES) * user_u64(p, MEMCPY3D_HEIGHT) *
		       user_u64(p, MEMCPY3D_DEPTH);
	}
	case NBOS_BYTES_2D_ARGS45: return PT_REGS_PARM4(ctx) * PT_REGS_PARM5(ctx);
	default: return 0;
	}
}

SEC("uprobe")
int nbos_cuda_call(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 kind = cookie & 0xff;
	__u32 from = (cookie >> 8) & 0xff;
	__u64 elem = (cookie >> 16) & 0xff;
	__u64 now = bpf_ktime_get_ns();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct nbos_activity *a = activity_of(tgid, now);
	if (!a)
		return 0;

	switch (kind) {
	case NBOS_CALL_LAUNCH:
		__sync_fetch_and_add(&a->launches, 1);
		break;
	case NBOS_CALL_COPY:
		__sync_fetch_and_add(&a->copies, 1);
		__sync_fetch_and_add(&a->copy_bytes, bytes_of(ctx, from));
		break;
	case NBOS_CALL_MEMSET:
		__sync_fetch_and_add(&a->memsets, 1);
		__sync_fetch_and_add(&a->memset_bytes, bytes_of(ctx, from) * (elem ? elem : 1));
		break;
	case NBOS_CALL_SYNC:
		__sync_fetch_and_add(&a->syncs, 1);
		break;
	default:
		break;
	}
	/* Plain store: threads racing here all write "now"-ish values; the newest-wins error is
	 * a few nanoseconds, far below what idle detection needs. */
	if (now > a->last_ns)
		a->last_ns = now;
	return 0;
}

/* sched_process_exit fires for every exiting thread; only the last one of a thread group
 * (signal->live dropped to 0 in do_exit before this tracepoint) means the process is gone. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(nbos_process_exit, struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;

	/* Nested rather than `!a && !w`: clang would OR the two pointers, which the verifier refuses. */
	struct nbos_activity *a = bpf_map_lookup_elem(&activity, &tgid);
	if (!a && !bpf_map_lookup_elem(&watched, &tgid))
		return 0;

	struct nbos_exit_event *e = bpf_ringbuf_reserve(&exits, sizeof(*e), 0);
	if (e) {
		e->tgid = tgid;
		e->exit_code = BPF_CORE_READ(task, exit_code);
		e->exit_ns = bpf_ktime_get_ns();
		e->pad = 0;
		if (a) {
			e->had_activity = 1;
			__builtin_memcpy(&e->activity, a, sizeof(*a));
		} else {
			e->had_activity = 0;
			__builtin_memset(&e->activity, 0, sizeof(e->activity));
		}
		bpf_ringbuf_submit(e, 0);
	} else {
		__u32 zero = 0;
		__u64 *drops = bpf_map_lookup_elem(&exit_drops, &zero);
		if (drops)
			*drops += 1; /* per-CPU slot: no other writer */
	}
	/* The pid may be reused: never let a new process inherit the old one's counts. */
	bpf_map_delete_elem(&activity, &tgid);
	bpf_map_delete_elem(&watched, &tgid);
	return 0;
}

#define NBOS_NR_IOCTL_X86_64 16
#define NBOS_NR_IOCTL_ARM64 29

/* Optional: ioctls on the NVIDIA device files. Kernel launches do not enter the kernel (they
 * are written to user-mapped queues), but context and memory management, some waits and
 * everything done by a process that bypasses the probed library (its own libcuda copy, a
 * static driver) do, so this finds GPU users the uprobes miss. It runs on every syscall of
 * the host (an id compare for all but ioctl), hence off unless configured. */
SEC("tp_btf/sys_enter")
int BPF_PROG(nbos_sys_enter, struct pt_regs *regs, long id)
{
#if defined(__TARGET_ARCH_x86)
	if (id != NBOS_NR_IOCTL_X86_64)
		return 0;
#elif defined(__TARGET_ARCH_arm64)
	if (id != NBOS_NR_IOCTL_ARM64)
		return 0;
#endif
	unsigned int fd = (unsigned int)PT_REGS_PARM1_CORE_SYSCALL(regs);
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *file = 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return 0;
	__u32 rdev = BPF_CORE_READ(file, f_inode, i_rdev);
	if (!bpf_map_lookup_elem(&gpu_devices, &rdev))
		return 0;

	__u64 now = bpf_ktime_get_ns();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct nbos_activity *a = activity_of(tgid, now);
	if (!a)
		return 0;
	__sync_fetch_and_add(&a->driver_ioctls, 1);
	if (now > a->last_ns)
		a->last_ns = now;
	return 0;
}
