/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Shared between bpf/device_guard.bpf.c and src/device_guard.rs (mirrored there, byte for byte). */
#ifndef NBOS_DEVICE_GUARD_H
#define NBOS_DEVICE_GUARD_H

/* The NVIDIA driver's fixed char major (/dev/nvidia0.., /dev/nvidiactl, /dev/nvidia-modeset). */
#define NBOS_NVIDIA_MAJOR 195
/* /dev/nvidiactl. */
#define NBOS_NVIDIACTL_MINOR 255
/* GPU minors tracked: 0..255 (the driver numbers GPUs from 0, well below 255). */
#define NBOS_MAX_MINORS 256
#define NBOS_MINOR_WORDS 4
/* BPF_DEVCG_DEV_CHAR of uapi/linux/bpf.h (a #define, so not in vmlinux.h). */
#define NBOS_DEVCG_DEV_CHAR 2

/* Value of the gpu_minors map: bit m set = GPU minor m may be opened. */
struct nbos_gpu_minors {
	__u64 bits[NBOS_MINOR_WORDS];
};

#endif
