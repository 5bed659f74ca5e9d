//! The `nbos` operator CLI: one module per subcommand.

pub mod bench;
pub mod chaos;
pub mod client;
pub mod cluster;
pub mod kernels;
pub mod not_yet;
pub mod objects;
pub mod observe;
pub mod pki;
pub mod progress;
pub mod proxy;
pub mod replay;
pub mod sim;
pub mod status;

pub use not_yet::NotYet;
