//! The large-object store of namespace sync: payloads over `sync_inline_max_bytes`
//! (arrays, tensors, big pickles) are written here under `objects/{sha256}` and only a
//! content-addressed pointer goes through a kernel's raft log.
//!
//! - [`store`]: the store. The backend is the `object_store` crate: a local directory by
//!   default (one host, or a directory every host mounts), or any S3-compatible store by
//!   URL (`s3://bucket/prefix`: every key goes under the prefix; credentials and endpoint
//!   from the usual `AWS_*` environment variables). Objects are named by their content;
//!   every read is checked against its name, so a corrupt or truncated object is an error,
//!   never state applied to a kernel, and every write rewrites (a tampered object is
//!   replaced from the writer's bytes, and the write renews the object's time).
//! - [`collect`]: which listed objects may go (pure: listing, references, clock, grace).
//! - [`super::object_collector`] (beside this module, as it reads the kernel groups'
//!   references through state sync): the meta leader's garbage collector: it lists the store, asks every
//!   host which objects its kernel groups refer to, and deletes the objects no one refers
//!   to that were last written more than the grace period ago.
//!
//! A local store is private: the default directory (`objects/` under the state directory,
//! or the dev cluster's per-user one) is 0700, owned by the daemon's user and not a
//! symlink ([`ensure_private_dir`]); every object file is 0600. Refusals are counted in
//! `notebookos_refused_total{reason="object_corrupt"|"object_store_not_private"}`.

pub mod collect;
pub mod store;

pub use store::{ensure_private_dir, sha256_hex, ObjectError, Objects, S3Options, StoredObject};
