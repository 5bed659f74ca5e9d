//! What a replica start and a state transfer cost, as this product measures them: the
//! cost file `docs/sim/costs.json`, written by `nbos bench kernel-start --costs-out` and
//! `nbos bench migration --costs-out` (each bench its own section), read here.
//!
//! A move (a replica to another host, on a cell's path or in the background) costs a
//! replica start on the target (pre-warmed if the target has a warm container, else cold)
//! plus the state transfer, `base + per_mib × namespace MiB`. The migration bench times
//! whole moves; its replica start (the kind it saw) is taken off its intercept so the
//! start is not charged twice.

use crate::Millis;

/// The cost file, as committed: what the default model uses (compiled in, so the crate
/// reads no file; `nbos sim --costs FILE` overrides it).
pub const MEASURED_JSON: &str = include_str!("../../../../docs/sim/costs.json");

/// Where a figure comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// The command that measured it.
    pub command: String,
    /// The build profile of the `nbos` that ran it (`release` or `debug`).
    pub profile: String,
    /// When (UTC, RFC 3339).
    pub date: String,
}

/// Which kind of replica start a measured move used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartKind {
    /// A process taken from the pre-warm pool.
    Prewarmed,
    /// A new Python.
    Cold,
}

/// `nbos bench kernel-start`, one host: create → first cell answered, p50.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaStart {
    /// Every replica a new Python.
    pub cold_ms: f64,
    /// Taken from the pre-warm pool.
    pub prewarmed_ms: f64,
    /// Provenance.
    pub measured: Measured,
}

/// One namespace size the migration bench measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MovePoint {
    /// Namespace carried, MiB.
    pub mib: f64,
    /// Cell sent (every replica's host busy) → running on the moved replica, p50, ms.
    pub move_p50_ms: f64,
    /// Samples at this size.
    pub samples: usize,
}

/// `nbos bench migration` at a few namespace sizes, fitted by least squares.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateTransfer {
    /// The fit's intercept: a whole move of an empty namespace, replica start included.
    pub move_base_ms: f64,
    /// The fit's slope: each MiB of namespace.
    pub per_mib_ms: f64,
    /// The replica start the bench's moves used (taken off `move_base_ms`).
    pub bench_start: StartKind,
    /// The measured points.
    pub points: Vec<MovePoint>,
    /// Provenance.
    pub measured: Measured,
}

/// The cost file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Costs {
    /// Concurrent moves onto one host; more wait for a slot (a host starts and fills a
    /// few replicas at a time, not hundreds).
    pub max_moves_per_host: u32,
    /// Replica start.
    pub replica_start: ReplicaStart,
    /// State transfer.
    pub state_transfer: StateTransfer,
}

/// Why a cost file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CostsError {
    /// Not the cost file's JSON.
    #[error("not a cost file (docs/sim/costs.json's format): {0}")]
    Json(#[from] serde_json::Error),
    /// A figure out of range.
    #[error("{field} must be a finite number >= 0, got {value}")]
    Figure {
        /// Which.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// No slot for moves.
    #[error("max_moves_per_host must be at least 1")]
    NoMoveSlot,
}

fn ms(x: f64) -> Millis {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "validated finite, >= 0")]
    let v = x.max(0.0).round() as Millis;
    v
}

impl Costs {
    /// Parses and checks a cost file.
    pub fn parse(json: &str) -> Result<Self, CostsError> {
        let c: Costs = serde_json::from_str(json)?;
        let figures = [
            ("replica_start.cold_ms", c.replica_start.cold_ms),
            ("replica_start.prewarmed_ms", c.replica_start.prewarmed_ms),
            ("state_transfer.move_base_ms", c.state_transfer.move_base_ms),
            ("state_transfer.per_mib_ms", c.state_transfer.per_mib_ms),
        ];
        for (field, value) in figures {
            if !(value.is_finite() && value >= 0.0) {
                return Err(CostsError::Figure { field, value });
            }
        }
        if c.max_moves_per_host == 0 {
            return Err(CostsError::NoMoveSlot);
        }
        Ok(c)
    }

    /// The committed cost file ([`MEASURED_JSON`]).
    pub fn measured() -> Self {
        // Compiled in and checked by a test below: no input reaches this.
        #[expect(clippy::expect_used, reason = "the committed file, parsed by a unit test")]
        let c = Self::parse(MEASURED_JSON).expect("docs/sim/costs.json parses");
        c
    }

    /// Starting a replica or container: from the pool, or a new Python.
    pub fn start_ms(&self, prewarmed: bool) -> Millis {
        ms(if prewarmed { self.replica_start.prewarmed_ms } else { self.replica_start.cold_ms })
    }

    /// Moving `mib` MiB of namespace into a started replica.
    pub fn transfer_ms(&self, mib: u64) -> Millis {
        let t = &self.state_transfer;
        let bench_start = match t.bench_start {
            StartKind::Prewarmed => self.replica_start.prewarmed_ms,
            StartKind::Cold => self.replica_start.cold_ms,
        };
        #[expect(clippy::cast_precision_loss, reason = "MiB of a namespace")]
        let per = t.per_mib_ms * mib as f64;
        ms((t.move_base_ms - bench_start).max(0.0) + per)
    }

    /// These costs with every state transfer `k` times as long (a replica's start kept):
    /// a trace replay compressed `k` times pays a real transfer's seconds × `k` in trace
    /// time, so its simulation does too.
    #[must_use]
    pub fn with_transfers_times(&self, k: f64) -> Self {
        let mut c = self.clone();
        let start = match c.state_transfer.bench_start {
            StartKind::Prewarmed => c.replica_start.prewarmed_ms,
            StartKind::Cold => c.replica_start.cold_ms,
        };
        let t = &mut c.state_transfer;
        t.move_base_ms = start + (t.move_base_ms - start).max(0.0) * k;
        t.per_mib_ms *= k;
        for p in &mut t.points {
            p.move_p50_ms = start + (p.move_p50_ms - start).max(0.0) * k;
        }
        c
    }

    /// A whole move: a replica start on the target plus the transfer.
    pub fn move_ms(&self, prewarmed: bool, mib: u64) -> Millis {
        self.start_ms(prewarmed) + self.transfer_ms(mib)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_times_k_scale_the_transfer_and_keep_the_start() {
        let c = costs(700.0, 600.0, 2_600.0, 4.0, StartKind::Prewarmed);
        let k = c.with_transfers_times(60.0);
        assert_eq!(k.start_ms(true), c.start_ms(true));
        assert_eq!(k.start_ms(false), c.start_ms(false));
        assert_eq!(k.transfer_ms(10), 60 * c.transfer_ms(10));
        assert_eq!(k.move_ms(true, 10), 600 + 60 * 2_040);
    }

    fn costs(cold: f64, warm: f64, base: f64, per: f64, kind: StartKind) -> Costs {
        let m = Measured { command: "test".into(), profile: "debug".into(), date: "2026-01-01T00:00:00Z".into() };
        Costs {
            max_moves_per_host: 2,
            replica_start: ReplicaStart { cold_ms: cold, prewarmed_ms: warm, measured: m.clone() },
            state_transfer: StateTransfer {
                move_base_ms: base,
                per_mib_ms: per,
                bench_start: kind,
                points: Vec::new(),
                measured: m,
            },
        }
    }

    #[test]
    fn the_committed_cost_file_parses_and_is_plausible() {
        let c = Costs::measured();
        assert!(c.start_ms(true) <= c.start_ms(false), "a pre-warmed start is not slower: {c:?}");
        assert!(c.transfer_ms(64) >= c.transfer_ms(1), "more namespace takes longer: {c:?}");
        assert!(!c.replica_start.measured.command.is_empty() && !c.state_transfer.points.is_empty());
    }

    #[test]
    fn the_benchs_own_start_is_not_charged_twice() {
        // Bench moves took a pre-warmed process: a 1,200 ms move base holds a 200 ms start.
        let c = costs(3_000.0, 200.0, 1_200.0, 10.0, StartKind::Prewarmed);
        assert_eq!(c.transfer_ms(0), 1_000);
        assert_eq!(c.move_ms(true, 0), 1_200, "what the bench measured");
        assert_eq!(c.move_ms(false, 100), 3_000 + 1_000 + 1_000);
        let c = costs(3_000.0, 200.0, 1_200.0, 10.0, StartKind::Cold);
        assert_eq!(c.transfer_ms(0), 0, "never negative");
    }

    #[test]
    fn bad_figures_are_refused_by_name() {
        let mut c = costs(1.0, 1.0, 1.0, -1.0, StartKind::Cold);
        let e = Costs::parse(&serde_json::to_string(&c).unwrap()).unwrap_err();
        assert!(e.to_string().contains("state_transfer.per_mib_ms"), "{e}");
        c.state_transfer.per_mib_ms = 1.0;
        c.max_moves_per_host = 0;
        assert!(matches!(Costs::parse(&serde_json::to_string(&c).unwrap()), Err(CostsError::NoMoveSlot)));
        assert!(matches!(Costs::parse("{}"), Err(CostsError::Json(_))));
    }
}
