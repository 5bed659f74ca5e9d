//! Loop devices (`<linux/loop.h>` ioctls): a free device, attached to an image file and
//! auto-cleared when its last user (a mount) is gone.

use std::fs::File;
use std::os::fd::AsRawFd;

// <linux/loop.h>: not in the libc crate.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// Detach the device when its last user (the mount) is gone.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The number of a free loop device (`/dev/loop<n>`), from `/dev/loop-control`.
pub fn free_device(control: &File) -> std::io::Result<u32> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
    let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    u32::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// Attaches `image` to `device` as its backing file, auto-cleared when unused. EBUSY
/// (`ErrorKind::ResourceBusy`): another process took the device first.
pub fn attach(device: &File, image: &File) -> std::io::Result<()> {
    // SAFETY: LOOP_SET_FD reads one file descriptor, which `image` keeps open.
    if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_FD, image.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    info.lo_flags = LO_FLAGS_AUTOCLEAR;
    // SAFETY: LOOP_SET_STATUS64 reads one loop_info64, which outlives the call.
    if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_STATUS64, &info) } != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: LOOP_CLR_FD takes no argument; it detaches what we attached.
        unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD) };
        return Err(std::io::Error::new(err.kind(), format!("making the device auto-clear: {err}")));
    }
    Ok(())
}
