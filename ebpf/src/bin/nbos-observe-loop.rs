//! The child of the observer bench: a launch loop driven over stdin/stdout, run under the CUDA
//! shim (`LD_PRELOAD`). See `nbos_ebpf::bench::child_main`; `cargo bench -p nbos-ebpf --bench
//! observe` and the bench's test start it.

fn main() {
    std::process::exit(nbos_ebpf::bench::child_main());
}
