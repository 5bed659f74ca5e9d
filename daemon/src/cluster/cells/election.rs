//! Executor election for one cell (F-cluster step 4): the replica the front-end
//! designated for a round proposes LEAD or YIELD by compare-and-swap of `elect/{cell}`
//! in the kernel's group, from the record the front-end last saw to the new one.
//!
//! Why this is safe under any reordering, duplication or delay of the front-end's
//! messages: every successful swap starts from a record *without* a winner (or from no
//! record), and nobody ever proposes from a record with a winner. So once a winner is
//! committed the key never changes again, and at most one replica wins a cell. A
//! proposal whose `expected` is not the current record (a stale round, a duplicate, a
//! second front-end) fails its swap and is told the current record instead.
//!
//! A LEAD swap also takes the kernel's `running` lock ([`RunningRecord`]) in the same
//! transaction, and only while nobody holds it: cells of one kernel sent through two
//! gateways at once run one after the other (the second is told `busy`), never side by
//! side from the same namespace (where the later commit would drop the earlier cell's
//! effects). The front-end may name a lock whose holder's host is gone (`steal`): the swap
//! then replaces exactly that record.

use std::time::Duration;

use raft_store::{Compare, Kv, Txn, TxnOp};

use crate::cluster::control::records::{decode, encode, keys, ElectionRecord, RunningRecord};

/// Prefix of yield notes (`yield/{cell}/{round:010}/{replica:04}`), removed with the cell's commit.
pub const YIELD_PREFIX: &str = "yield/";

/// How often an outcome-unknown swap (timeout, leadership change) is retried.
const UNKNOWN_OUTCOME_RETRIES: u32 = 5;

/// Who proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposer {
    /// Replica number (1-based).
    pub replica: u32,
    /// Its host.
    pub node_id: u64,
}

/// What the designee proposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Its host can commit the cell's GPUs now: it wants to execute.
    Lead,
    /// It cannot; why (shown to the client while the cell waits).
    Yield {
        /// Reason.
        reason: String,
    },
}

/// How a proposal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This LEAD was committed: the proposer executes the cell.
    Won(ElectionRecord),
    /// This YIELD was committed: the round has no winner.
    Yielded(ElectionRecord),
    /// The swap failed and the cell already has a winner (final): here is its record.
    Taken(ElectionRecord),
    /// The swap failed (stale round, or another proposal got there first) and the
    /// cell has no winner yet: the current record, if any, for the next round's `expected`.
    Stale(Option<ElectionRecord>),
    /// The LEAD swap failed because another cell of the kernel runs (its lock); the
    /// cell's record is unchanged (`expected` stays).
    Busy(RunningRecord),
}

impl Outcome {
    /// The wire name (`metadata.nbos_election.outcome`).
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Won(_) => "won",
            Outcome::Yielded(_) => "yielded",
            Outcome::Taken(_) => "taken",
            Outcome::Stale(_) => "stale",
            Outcome::Busy(_) => "busy",
        }
    }

    /// The record the outcome carries.
    pub fn record(&self) -> Option<&ElectionRecord> {
        match self {
            Outcome::Won(r) | Outcome::Yielded(r) | Outcome::Taken(r) => Some(r),
            Outcome::Stale(r) => r.as_ref(),
            Outcome::Busy(_) => None,
        }
    }
}

/// Why a proposal could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The store refused or failed (not proposed, or still unknown after retries).
    #[error("election for cell {cell}: {source}")]
    Store {
        /// The cell.
        cell: String,
        /// The failure.
        #[source]
        source: raft_store::Error,
    },
    /// `elect/{cell}` holds something that is not an election record.
    #[error("election for cell {cell}: {reason}")]
    Corrupt {
        /// The cell.
        cell: String,
        /// What is wrong.
        reason: String,
    },
}

fn classify(current: Option<ElectionRecord>) -> Outcome {
    match current {
        Some(r) if r.winner.is_some() => Outcome::Taken(r),
        other => Outcome::Stale(other),
    }
}

fn settled(new: ElectionRecord) -> Outcome {
    if new.winner.is_some() {
        Outcome::Won(new)
    } else {
        Outcome::Yielded(new)
    }
}

/// The cell's current record (linearizable read).
pub async fn current(kv: &Kv, cell: &str) -> Result<Option<ElectionRecord>, ElectionError> {
    let key = keys::elect(cell);
    let got = kv.get(key.as_bytes()).await.map_err(|source| ElectionError::Store { cell: cell.to_owned(), source })?;
    got.map(|kv| decode_record(cell, &kv.value)).transpose()
}

fn decode_record(cell: &str, value: &[u8]) -> Result<ElectionRecord, ElectionError> {
    decode(keys::elect(cell).as_bytes(), value)
        .map_err(|e| ElectionError::Corrupt { cell: cell.to_owned(), reason: format!("{e:#}") })
}

/// The kernel's cell in progress (its lock), from this replica's applied state (stale).
pub async fn running_stale(kv: &Kv) -> Option<RunningRecord> {
    let got = kv.get_stale(keys::RUNNING.as_bytes().to_vec()).await.ok()?.kvs.into_iter().next()?;
    decode(&got.key, &got.value).ok()
}

/// Removes the kernel's lock if it is still exactly `held` (a compare-and-delete; a lock
/// taken since by another cell stays). Retries a few times: a lock left behind blocks the
/// kernel's next cells until a front-end takes it over.
pub async fn release_running(kv: &Kv, held: &RunningRecord) {
    let txn = Txn::new()
        .when(Compare::value_equals(keys::RUNNING.as_bytes().to_vec(), encode(held)))
        .and_then(TxnOp::delete(keys::RUNNING.as_bytes().to_vec()));
    for attempt in 1..=5u64 {
        match kv.txn(txn.clone()).await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(cell = %held.cell, attempt, error = %e, "releasing the kernel's running lock");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
        }
    }
    tracing::warn!(cell = %held.cell, "could not release the kernel's running lock; a front-end takes it over once its host is gone");
}

/// Where a swap stands after it did not apply.
struct NotSwapped {
    /// The cell's record as stored (its bytes).
    previous: Option<Vec<u8>>,
    /// The kernel's lock, when a LEAD swap found it held.
    running: Option<RunningRecord>,
}

/// One swap attempt: a plain CAS for YIELD; for LEAD a transaction that also takes the
/// kernel's lock (absent, or exactly `steal`).
async fn swap(
    kv: &Kv,
    cell: &str,
    expected: Option<&Vec<u8>>,
    new: &ElectionRecord,
    me: Proposer,
    steal: Option<&RunningRecord>,
) -> Result<Result<(), NotSwapped>, raft_store::Error> {
    let key = keys::elect(cell);
    if new.winner.is_none() {
        let o = kv.cas(key.as_bytes(), expected.cloned(), encode(new)).await?;
        return Ok(if o.succeeded { Ok(()) } else { Err(NotSwapped { previous: o.previous, running: None }) });
    }
    let lock = keys::RUNNING.as_bytes().to_vec();
    let mine = RunningRecord { cell: cell.to_owned(), replica: me.replica, node_id: me.node_id };
    let txn = Txn::new()
        .when(match expected {
            Some(bytes) => Compare::value_equals(key.as_bytes().to_vec(), bytes.clone()),
            None => Compare::absent(key.as_bytes().to_vec()),
        })
        .when(match steal {
            Some(held) => Compare::value_equals(lock.clone(), encode(held)),
            None => Compare::absent(lock.clone()),
        })
        .and_then(TxnOp::put(key.as_bytes().to_vec(), encode(new)))
        .and_then(TxnOp::put(lock.clone(), encode(&mine)));
    if kv.txn(txn).await?.succeeded {
        return Ok(Ok(()));
    }
    let previous = kv.get(key.as_bytes()).await?.map(|kv| kv.value);
    let running = kv.get(lock).await?.and_then(|kv| decode::<RunningRecord>(&kv.key, &kv.value).ok());
    Ok(Err(NotSwapped { previous, running }))
}

/// Proposes `decision` for `round` of `cell`, by swap from `expected` (the record the
/// front-end last saw; `None` in round 0). A LEAD takes the kernel's lock with it; `steal`
/// is a lock the front-end saw held by a host that is gone.
pub async fn propose(
    kv: &Kv,
    cell: &str,
    round: u32,
    expected: Option<&ElectionRecord>,
    me: Proposer,
    decision: Decision,
    steal: Option<&RunningRecord>,
) -> Result<Outcome, ElectionError> {
    let store_err = |source| ElectionError::Store { cell: cell.to_owned(), source };
    if let Some(e) = expected {
        // A record with a winner is final; proposing from it is the one swap that could elect twice.
        if e.winner.is_some() {
            return Ok(Outcome::Taken(e.clone()));
        }
        if round <= e.round {
            return Ok(classify(current(kv, cell).await?));
        }
    }
    let new = match decision {
        Decision::Lead => {
            ElectionRecord { round, winner: Some(me.replica), node_id: me.node_id, reason: String::new() }
        }
        Decision::Yield { reason } => ElectionRecord { round, winner: None, node_id: me.node_id, reason },
    };
    let mut expected_bytes = expected.map(encode);
    // True once a swap of ours may have been applied without our hearing of it: only
    // then does finding our own record mean we won (a duplicate request must not).
    let mut maybe_applied = false;
    let mut retries = 0;
    loop {
        match swap(kv, cell, expected_bytes.as_ref(), &new, me, steal).await {
            Ok(Ok(())) => return Ok(settled(new)),
            Ok(Err(not)) => {
                let previous = not.previous.as_deref().map(|v| decode_record(cell, v)).transpose()?;
                if maybe_applied && previous.as_ref() == Some(&new) {
                    return Ok(settled(new));
                }
                // Same record, other bytes (written by another version's encoder): swap
                // from the bytes actually stored.
                if previous.is_some() && previous.as_ref() == expected && not.previous != expected_bytes {
                    expected_bytes = not.previous;
                    continue;
                }
                // The record is as expected: the lock stopped the swap.
                if previous.as_ref() == expected {
                    match not.running {
                        Some(held) if steal != Some(&held) => return Ok(Outcome::Busy(held)),
                        // Released (or the stolen lock is gone) meanwhile: swap again.
                        _ if retries < UNKNOWN_OUTCOME_RETRIES => {
                            retries += 1;
                            continue;
                        }
                        _ => {}
                    }
                }
                return Ok(classify(previous));
            }
            Err(e) if e.outcome_unknown() && retries < UNKNOWN_OUTCOME_RETRIES => {
                retries += 1;
                maybe_applied = true;
                tracing::debug!(cell, round, error = %e, "election swap outcome unknown; checking");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(retries))).await;
                let now = match current(kv, cell).await {
                    Ok(r) => r,
                    Err(ElectionError::Store { source, .. }) if source.outcome_unknown() => continue,
                    Err(e) => return Err(e),
                };
                if now.as_ref() == Some(&new) {
                    return Ok(settled(new));
                }
                if now.as_ref() != expected {
                    return Ok(classify(now));
                }
            }
            Err(e) => return Err(store_err(e)),
        }
    }
}

/// How long a replica told to yield waits before noting it: the designee's swap goes
/// first, and a cell decided by then needs no note.
pub const YIELD_NOTE_DELAY: Duration = Duration::from_millis(100);

/// Notes that `replica` yielded `round` of `cell` without proposing (best effort: the
/// record is for operators and the bench, the front-end does not wait for it). Written
/// [`YIELD_NOTE_DELAY`] later and only while the cell has no winner here: a note is not a
/// write on the elected cell's path, and none is left behind after the commit that removes
/// the cell's notes.
pub async fn note_yield(kv: &Kv, cell: &str, round: u32, replica: u32) {
    tokio::time::sleep(YIELD_NOTE_DELAY).await;
    let decided = kv.get_stale(keys::elect(cell).into_bytes()).await.ok().and_then(|o| o.kvs.into_iter().next());
    if decided.is_some_and(|kv| decode_record(cell, &kv.value).is_ok_and(|r| r.winner.is_some())) {
        return;
    }
    let key = format!("{YIELD_PREFIX}{cell}/{round:010}/{replica:04}");
    if let Err(e) = kv.put(key.as_bytes(), b"1".to_vec()).await {
        tracing::debug!(cell, round, replica, error = %e, "yield note not written");
    }
}
