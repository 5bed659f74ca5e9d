//! The protocol's messages.

/// A GPU's 16-byte UUID as the driver reports it (`cuDeviceGetUuid`).
pub type GpuUuid = [u8; 16];

/// One protocol message (shim → host or host → shim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Shim → host, first frame: who this process claims to be. The host checks the
    /// claim against the socket's `SO_PEERCRED`.
    Register {
        /// The notebook kernel's id.
        kernel_id: String,
        /// Replica number of the kernel (0..3).
        replica: u32,
        /// The process id (must equal the peer's).
        pid: u32,
    },
    /// Host → shim: registration accepted.
    Registered {
        /// How many GPUs the process sees (its virtual device count).
        device_count: u32,
        /// How often to send [`Message::Activity`] while bound, ms (0: never).
        activity_interval_ms: u32,
        /// Device memory the process may allocate (`cuMemAlloc`), bytes (0: no limit).
        memory_limit_bytes: u64,
        /// The process's pid as the host sees it (its socket peer's): a kernel in a PID
        /// namespace of its own knows only its pid there. It names the process's counters
        /// file and is what the real driver (and NVML) records.
        host_pid: u32,
        /// Full path of the real CUDA driver library the shim forwards to (told here, not
        /// in the kernel's environment). At most [`crate::MAX_PATH`] bytes.
        driver_path: String,
    },
    /// Shim → host: a gated call needs GPUs.
    Request {
        /// GPUs wanted (the registered count).
        gpus: u32,
    },
    /// Host → shim: GPUs are bound (and the process's memory restored onto them).
    Grant {
        /// Lease number, echoed in [`Message::Released`].
        lease: u64,
        /// The physical GPUs, in virtual ordinal order.
        gpus: Vec<GpuUuid>,
    },
    /// Host → shim: give the GPUs back.
    Revoke {
        /// The lease to end.
        lease: u64,
    },
    /// Shim → host: no submission is in flight and all work has completed.
    Released {
        /// The lease that ended.
        lease: u64,
    },
    /// Shim → host: counters since the process started.
    Activity {
        /// Gated calls made (approximate: counted without atomics on the hot path).
        calls: u64,
        /// Times a call had to wait for a lease.
        waits: u64,
    },
    /// Host → shim: registration refused; the host closes the connection.
    Refused {
        /// Why, for the process's log.
        reason: String,
    },
    /// Shim → host: GPUs of a grant that this process's driver does not list (by UUID).
    /// The shim never substitutes another GPU: calls naming them fail with
    /// `CUDA_ERROR_INVALID_DEVICE`. Sent once per grant that names any.
    GpusNotVisible {
        /// The grant that named them.
        lease: u64,
        /// The UUIDs the driver does not list.
        gpus: Vec<GpuUuid>,
    },
}

impl Message {
    /// The frame tag.
    pub fn tag(&self) -> u8 {
        match self {
            Self::Register { .. } => 1,
            Self::Registered { .. } => 2,
            Self::Request { .. } => 3,
            Self::Grant { .. } => 4,
            Self::Revoke { .. } => 5,
            Self::Released { .. } => 6,
            Self::Activity { .. } => 7,
            Self::Refused { .. } => 8,
            Self::GpusNotVisible { .. } => 9,
        }
    }
}
