//! `--costs-out FILE` of `nbos bench kernel-start` and `nbos bench migration`: each bench
//! writes its own section of the simulator's cost file (`docs/sim/costs.json`, read by
//! `nbos_sched::sim::costs`) and keeps the rest, so either can be rerun alone.

use std::path::Path;

use anyhow::Context as _;
use nbos_sched::sim::costs::{Costs, Measured};

/// Concurrent moves onto one host when the file has no cap yet: a host starts a couple of
/// replicas and catches them up at a time (the daemon moves a draining host's replicas one
/// after another, a cell's migration alongside).
const DEFAULT_MAX_MOVES_PER_HOST: u32 = 2;

/// This run's provenance: the command line, `nbos`'s build profile, the date.
pub fn measured() -> Measured {
    let args: Vec<String> = std::env::args().skip(1).collect();
    Measured {
        command: format!("nbos {}", args.join(" ")),
        profile: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }
}

/// Sets `key` in the cost file at `path` (created if absent) to `section`; once both
/// benches have written, checks that the simulator accepts the file.
pub fn update(path: &Path, key: &str, section: impl serde::Serialize) -> anyhow::Result<()> {
    let mut doc = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            serde_json::json!({ "max_moves_per_host": DEFAULT_MAX_MOVES_PER_HOST })
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let obj = doc.as_object_mut().with_context(|| format!("{} is not a JSON object", path.display()))?;
    obj.insert(key.to_owned(), serde_json::to_value(section)?);
    let complete = obj.contains_key("replica_start") && obj.contains_key("state_transfer");
    let text = format!("{doc:#}\n");
    if complete {
        Costs::parse(&text).with_context(|| format!("the updated {} would not be a cost file", path.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {key} to {}", path.display());
    Ok(())
}
