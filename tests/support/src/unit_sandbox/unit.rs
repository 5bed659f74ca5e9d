//! The `[Service]` section of a unit file as systemd reads it: `Key=value` lines in order,
//! comments and other sections left out, a key assigned again adding to (or, assigned empty,
//! resetting) what it had.

use std::collections::BTreeMap;

/// Each key of `[Service]` with its assignments in order (an empty one resets the list).
#[derive(Debug, Default)]
pub struct Service {
    keys: BTreeMap<String, Vec<String>>,
}

impl Service {
    pub fn parse(text: &str) -> Self {
        let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut in_service = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            if !in_service || line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else { continue };
            let values = keys.entry(key.trim().to_owned()).or_default();
            if value.trim().is_empty() {
                values.clear();
            } else {
                values.push(value.trim().to_owned());
            }
        }
        Self { keys }
    }

    /// Every key the section sets.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// The last assignment of `key` (what a single-valued setting takes).
    pub fn one(&self, key: &str) -> Option<&str> {
        self.keys.get(key).and_then(|v| v.last()).map(String::as_str)
    }

    /// Every assignment of `key`, in order.
    pub fn all(&self, key: &str) -> &[String] {
        self.keys.get(key).map_or(&[], Vec::as_slice)
    }

    /// A boolean setting (`yes`/`true`/`1` or `no`/`false`/`0`; unset: false).
    pub fn yes(&self, key: &str) -> anyhow::Result<bool> {
        match self.one(key) {
            None | Some("no" | "false" | "0") => Ok(false),
            Some("yes" | "true" | "1") => Ok(true),
            Some(other) => anyhow::bail!("{key}={other}: not a boolean the sandbox knows"),
        }
    }

    /// The space-separated words of every assignment of `key`.
    pub fn words(&self, key: &str) -> Vec<&str> {
        self.all(key).iter().flat_map(|v| v.split_whitespace()).collect()
    }
}
