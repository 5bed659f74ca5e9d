// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* GPU device access of kernel processes, enforced in the kernel (BPF_PROG_TYPE_CGROUP_DEVICE).
 *
 * Attached by a BPF link (multi-attach semantics) to each kernel's cgroup, so the programs of
 * the cgroup's ancestors still run and must allow too: this program only narrows the NVIDIA majors and
 * answers "allow" for every other device, leaving /dev/null, ptys etc. as they were.
 *
 * Char major 195 (nvidia): minor 255 (/dev/nvidiactl) is allowed; a GPU minor is allowed
 * only while the process's cgroup is in `gpu_minors` with that minor's bit set (the daemon
 * sets it on lease grant and clears it on release). Everything else of major 195 is denied
 * (/dev/nvidia-modeset included). nvidia-uvm and nvidia-uvm-tools have dynamic majors and are
 * left alone like every other major: they hold no GPU of their own (a GPU is reached through
 * its /dev/nvidiaN), so nothing needs to know their numbers. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "device_guard.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Allowed GPU minors per kernel cgroup (key: cgroup id, the cgroup directory's inode).
 * Sized from user space (EbpfLoader::map_max_entries); this is the default. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct nbos_gpu_minors);
} gpu_minors SEC(".maps");

/* Accesses denied since load, summed over CPUs by user space (a metric). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} denials SEC(".maps");

static __always_inline int deny(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&denials, &zero);
	if (n)
		*n += 1;
	return 0;
}

SEC("cgroup/dev")
int nbos_device_guard(struct bpf_cgroup_dev_ctx *ctx)
{
	__u32 type = ctx->access_type & 0xffff;
	if (type != NBOS_DEVCG_DEV_CHAR)
		return 1;
	if (ctx->major != NBOS_NVIDIA_MAJOR)
		return 1;
	if (ctx->minor == NBOS_NVIDIACTL_MINOR)
		return 1;
	if (ctx->minor >= NBOS_MAX_MINORS)
		return deny();
	__u64 cgroup = bpf_get_current_cgroup_id();
	struct nbos_gpu_minors *allowed = bpf_map_lookup_elem(&gpu_minors, &cgroup);
	/* No entry: a cgroup below the kernel's (or one being torn down): fail closed. */
	if (!allowed)
		return deny();
	__u32 minor = ctx->minor;
	if (allowed->bits[(minor / 64) & (NBOS_MINOR_WORDS - 1)] & (1ULL << (minor % 64)))
		return 1;
	return deny();
}
