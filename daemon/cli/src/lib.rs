//! The `nbos` operator CLI: one module per subcommand. The benchmarks, `nbos replay` and
//! `nbos sim` live in the `nbos-bench` crate (the only one that needs etcd's client), with the
//! daemon client and progress bars they share; they are re-exported here under the names
//! the subcommands have.

pub use nbos_bench::{self as bench, client, progress, replay, sim};

pub mod chaos;
pub mod cluster;
pub mod kernels;
pub mod not_yet;
pub mod objects;
pub mod observe;
pub mod pki;
pub mod proxy;
pub mod status;

pub use not_yet::NotYet;
