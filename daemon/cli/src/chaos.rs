//! `nbos chaos check-history FILE`: checks the canary-register history the fault campaign
//! recorded against the meta store (`tests/chaos/`, `POST /api/v1/cluster/canary`) for
//! linearizability, with the raft store's own checker, one register at a time.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use raft_store::linearizability::{check, Event, Op};
use serde::Deserialize;

/// `nbos chaos …`.
#[derive(Debug, clap::Subcommand)]
pub enum ChaosCmd {
    /// Check a canary-register history (JSON lines) for linearizability; exit 1 when a
    /// register's history is not.
    CheckHistory(CheckArgs),
}

/// Options of `nbos chaos check-history`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// JSON lines, one operation each: `{"name": R, "op": "read"|"write"|"cas", "value": V,
    /// "expected": E, "new": N, "ok": B, "call": T, "ret": T|null}` (times in nanoseconds of
    /// one clock; `ret` null when no answer came, `value` what a read returned).
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One line of a history file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    name: String,
    op: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    expected: Option<String>,
    #[serde(default)]
    new: Option<String>,
    #[serde(default)]
    ok: Option<bool>,
    call: u128,
    ret: Option<u128>,
}

impl Line {
    fn event(self) -> anyhow::Result<(String, Event)> {
        let op = match self.op.as_str() {
            "read" => Op::Read(self.value),
            "write" => Op::Write(self.value.context("a write without its value")?),
            "cas" => {
                Op::Cas { expected: self.expected, new: self.new.context("a cas without its new value")?, ok: self.ok }
            }
            other => anyhow::bail!("unknown op {other:?} (read, write or cas)"),
        };
        anyhow::ensure!(self.ret.is_none_or(|r| r >= self.call), "an answer before its call");
        Ok((self.name, Event { op, call: self.call, ret: self.ret }))
    }
}

/// Per register: (operations, answered, linearizable).
type Verdicts = BTreeMap<String, (usize, usize, bool)>;

/// Parses `text` (JSON lines) and checks each register's history.
pub fn check_history(text: &str) -> anyhow::Result<Verdicts> {
    let mut registers: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let parsed: Line = serde_json::from_str(line).with_context(|| format!("line {}", i + 1))?;
        let (name, event) = parsed.event().with_context(|| format!("line {}", i + 1))?;
        registers.entry(name).or_default().push(event);
    }
    Ok(registers
        .into_iter()
        .map(|(name, events)| {
            let answered = events.iter().filter(|e| e.ret.is_some()).count();
            (name, (events.len(), answered, check(&events)))
        })
        .collect())
}

/// Runs a `nbos chaos` subcommand.
pub fn run(cmd: ChaosCmd) -> anyhow::Result<()> {
    let ChaosCmd::CheckHistory(a) = cmd;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let verdicts = check_history(&text).with_context(|| format!("parsing {}", a.file.display()))?;
    let bad: Vec<&String> = verdicts.iter().filter(|(_, v)| !v.2).map(|(n, _)| n).collect();
    if a.json {
        let registers: Vec<serde_json::Value> = verdicts
            .iter()
            .map(|(n, (ops, answered, ok))| {
                serde_json::json!({ "name": n, "operations": ops, "answered": answered, "linearizable": ok })
            })
            .collect();
        println!("{}", serde_json::json!({ "linearizable": bad.is_empty(), "registers": registers }));
    } else {
        for (n, (ops, answered, ok)) in &verdicts {
            let verdict = if *ok { "linearizable" } else { "NOT linearizable" };
            println!("{n}: {ops} operations ({answered} answered): {verdict}");
        }
    }
    anyhow::ensure!(
        bad.is_empty(),
        "not linearizable: {}",
        bad.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_register_is_checked_on_its_own_and_a_stale_read_is_caught() {
        let good = r#"{"name": "a", "op": "write", "value": "1", "call": 0, "ret": 10}
{"name": "b", "op": "cas", "expected": null, "new": "x", "ok": true, "call": 5, "ret": 8}
{"name": "a", "op": "read", "value": "1", "call": 20, "ret": 30}
{"name": "a", "op": "write", "value": "2", "call": 31, "ret": null}
{"name": "b", "op": "read", "value": "x", "call": 40, "ret": 41}
"#;
        let v = check_history(good).expect("parse");
        assert_eq!(v["a"], (3, 2, true));
        assert_eq!(v["b"], (2, 2, true));
        // Register b: a read after the CAS answered sees the value from before it.
        let stale =
            format!("{good}{{\"name\": \"b\", \"op\": \"read\", \"value\": null, \"call\": 50, \"ret\": 51}}\n");
        let v = check_history(&stale).expect("parse");
        assert!(v["a"].2, "a is untouched");
        assert!(!v["b"].2, "the stale read of b is caught");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_number() {
        for (bad, why) in [
            (r#"{"name": "a", "op": "write", "call": 0, "ret": 1}"#, "without its value"),
            (r#"{"name": "a", "op": "delete", "call": 0, "ret": 1}"#, "unknown op"),
            (r#"{"name": "a", "op": "read", "call": 5, "ret": 1}"#, "before its call"),
            (r#"{"name": "a", "op": "read", "call": 0, "ret": 1, "extra": 2}"#, "unknown field"),
            ("not json", "expected"),
        ] {
            let e = check_history(&format!("\n{bad}\n")).expect_err(bad);
            let text = format!("{e:#}");
            assert!(text.contains("line 2") && text.contains(why), "{bad}: {text}");
        }
    }
}
