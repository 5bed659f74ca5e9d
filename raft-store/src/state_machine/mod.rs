//! The replicated KV state machine: commands that go through the log, and the state they build.

pub mod command;
pub mod kv;

pub use command::{CasOutcome, Command, CommandOutput, KeyValue, WatchEvent, WatchEventKind};
pub use kv::KvState;
