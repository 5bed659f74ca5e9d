//! Flags for opening files the daemon must not be tricked through (`OpenOptionsExt::
//! custom_flags`) and the set-id mode bits.

pub use libc::{O_NOCTTY, O_NOFOLLOW, O_NONBLOCK, S_ISGID, S_ISUID};
