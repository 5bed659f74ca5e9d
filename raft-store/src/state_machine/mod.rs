//! The replicated KV state machine: commands that go through the log, and the state they build.

pub mod command;
pub mod kv;

pub use command::{
    CasOutcome, Command, CommandOutput, Compare, CompareTarget, KeyValue, Txn, TxnOp, TxnOpResult, TxnResponse,
    WatchEvent, WatchEventKind,
};
pub use kv::KvState;
