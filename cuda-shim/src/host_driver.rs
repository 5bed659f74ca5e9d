//! Wires the lease client's answer ("which driver library the host named") into
//! [`crate::driver`] when the library is loaded, before any CUDA call can reach the driver.
//! The client loads entry points from the driver module, so the driver module cannot ask
//! the client itself (no import circle): this constructor hands it the function instead.

/// In `.init_array`: the dynamic loader runs it when the shim is loaded (`LD_PRELOAD` or
/// as `libcuda.so.1`), and an executable linking the crate runs it at start-up.
#[used]
#[link_section = ".init_array"]
static WIRE_HOST_DRIVER_LOCATOR: extern "C" fn() = {
    extern "C" fn wire() {
        crate::driver::set_host_locator(crate::client::registered_driver_path);
    }
    wire
};
