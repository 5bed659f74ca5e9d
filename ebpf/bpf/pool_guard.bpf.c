// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* The pre-warm pool's processes out of the kernels' reach (BPF_PROG_TYPE_LSM).
 *
 * Pool processes run as the kernels' shared account (kernel.user), so the kernel's own
 * checks let any kernel signal or ptrace them: a SIGSTOP to each would leave the pool full
 * of processes that never become kernels. The daemon puts a pool process's tgid in
 * `protected` when it starts it and takes it out when the process becomes a kernel or is
 * gone. For a protected target these hooks refuse (-EPERM) a signal (kill, tkill,
 * pidfd_send_signal, sigqueue), a signal through F_SETOWN/F_SETSIG, and ptrace or
 * ptrace-checked /proc access, unless it comes from root (real uid 0: the daemon, an
 * operator) or from the process itself. Signal 0 (an existence probe) stays allowed. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NBOS_EPERM 1

/* Protected tgids (value unused). Sized from user space (EbpfLoader::map_max_entries). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} protected SEC(".maps");

/* Refusals since load, summed over CPUs by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} denials SEC(".maps");

static __always_inline int refuse(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&denials, &zero);
	if (n)
		*n += 1;
	return -NBOS_EPERM;
}

/* Whether `sender_uid` (of the current task, or of the F_SETOWN owner) may reach `target`. */
static __always_inline int check(struct task_struct *target, __u32 sender_uid)
{
	__u32 tgid = BPF_CORE_READ(target, tgid);
	if (!bpf_map_lookup_elem(&protected, &tgid))
		return 0;
	if (sender_uid == 0)
		return 0;
	if ((__u32)(bpf_get_current_pid_tgid() >> 32) == tgid)
		return 0;
	return refuse();
}

SEC("lsm/task_kill")
int BPF_PROG(nbos_pool_task_kill, struct task_struct *p, struct kernel_siginfo *info, int sig,
	     const struct cred *cred, int ret)
{
	if (ret)
		return ret;
	if (sig == 0)
		return 0;
	/* `cred` is set for a signal sent on behalf of another (USB async I/O): judge that one. */
	__u32 uid = cred ? BPF_CORE_READ(cred, uid.val) : (__u32)bpf_get_current_uid_gid();
	return check(p, uid);
}

SEC("lsm/file_send_sigiotask")
int BPF_PROG(nbos_pool_sigiotask, struct task_struct *tsk, struct fown_struct *fown, int sig, int ret)
{
	if (ret)
		return ret;
	/* The owner set with F_SETOWN decides, not whoever triggered the I/O. */
	return check(tsk, BPF_CORE_READ(fown, uid.val));
}

SEC("lsm/ptrace_access_check")
int BPF_PROG(nbos_pool_ptrace, struct task_struct *child, unsigned int mode, int ret)
{
	if (ret)
		return ret;
	return check(child, (__u32)bpf_get_current_uid_gid());
}
