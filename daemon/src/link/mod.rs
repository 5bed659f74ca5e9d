//! How a program reaches a host's HTTP API: the Kernel Gateway client ([`client`]), the
//! endpoint file a running daemon writes for local clients ([`endpoint`]), the API
//! token ([`token`]), how hosts call each other ([`host`], [`credential`]) and where a
//! host serves its replicas to the others ([`peer_routes`]).
//!
//! It sits below both the gateway and the cluster: the CLI, the cluster's front-ends
//! (their internal WebSocket to another host's gateway) and the servers' token checks all
//! use it, and it uses nothing above the kernel model.

pub mod client;
pub mod credential;
pub mod endpoint;
pub mod host;
pub mod peer_routes;
pub mod tls;
pub mod token;
