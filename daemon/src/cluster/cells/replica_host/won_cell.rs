//! The won-cell sequence of a replica host as a pure state machine: events in, actions
//! out, no I/O, no clock (the times of [`Dispatched`] are inputs). Its driver
//! ([`super::won_cell_driver`]) performs each action and feeds back what came of it.
//!
//! The sequence: catch the local namespace up with the election's record, hold
//! ipykernel's reply and send the cell to the kernel, wait for the reply, export and
//! commit the namespace, and only then release the reply with the `executed` outcome.
//! Every end releases the kernel's lock (`running/`) except a committed namespace, whose
//! commit removes it; every end answers the front-end once, except a replica that died
//! (its front-end learns that from the link or the record).

use std::time::SystemTime;

/// When a won cell reached its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatched {
    /// Binding committed the cell's GPUs (kernels with GPUs).
    pub gpus_bound: Option<SystemTime>,
    /// The `execute_request` was written to the kernel's shell socket.
    pub written: SystemTime,
}

/// What the namespace export of a cell that ran here came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The group revision of the committed namespace.
    pub revision: u64,
    /// Names that could not be pickled, with why (`name: error`).
    pub unpicklable: Vec<String>,
}

/// What happened, fed to [`WonCell::on`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WonCellEvent {
    /// The local namespace caught up with the election's record, or could not (why).
    CaughtUp(Result<(), String>),
    /// The cell reached the kernel (`None`: binding refused it and answered itself, or the
    /// kernel went away), or could not be sent (why).
    Dispatched(Result<Option<Dispatched>, String>),
    /// ipykernel's reply came, with its `execution_count` (`None`: the kernel died first).
    Replied(Option<serde_json::Value>),
    /// The namespace was exported and committed, or not (why).
    Exported(Result<Exported, String>),
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum WonCellAction {
    /// Wait for the local namespace to reach the election's record; report [`WonCellEvent::CaughtUp`].
    CatchUp,
    /// Hold ipykernel's reply, then send the cell to the kernel; report [`WonCellEvent::Dispatched`].
    HoldReplyAndDispatch,
    /// Wait for ipykernel's reply or the kernel's death; report [`WonCellEvent::Replied`].
    AwaitReply,
    /// Export the namespace and commit it; report [`WonCellEvent::Exported`].
    ExportAndCommit,
    /// Stop holding ipykernel's reply (it goes out as it comes, if it does).
    UnholdReply,
    /// Tell the cell's clients on stderr (a `stream` message).
    Warn(String),
    /// This replica's namespace no longer follows the group's (why).
    MarkDiverged(String),
    /// Release the kernel's lock this win took.
    ReleaseLock,
    /// Answer the cell with an error of the kernel's own (it never ran).
    RejectCell { ename: &'static str, evalue: String },
    /// Answer the front-end with an `execute_reply` of this host: the cell did not run;
    /// `content` is the reply's content, the outcome `executed` at revision 0.
    AnswerNotRun { content: serde_json::Value },
    /// Release ipykernel's held reply with the `executed` outcome at `revision` (and the
    /// dispatch times); `content` replaces its content when set.
    ReleaseReply { revision: u64, dispatched: Option<Dispatched>, content: Option<serde_json::Value> },
}

/// Where a won cell is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Waiting for the namespace to catch up.
    CatchingUp,
    /// Sending the cell to the kernel.
    Dispatching,
    /// The kernel runs the cell.
    Running,
    /// Exporting and committing the namespace.
    Exporting,
    /// Over: nothing more to do.
    Done,
}

/// One won cell of one replica.
#[derive(Debug, Clone)]
pub struct WonCell {
    cell: String,
    replica: u32,
    node_id: u64,
    step: Step,
    dispatched: Option<Dispatched>,
    execution_count: serde_json::Value,
}

impl WonCell {
    /// Cell `cell` won by replica `replica` on host `node_id`, and its first action.
    pub fn start(cell: &str, replica: u32, node_id: u64) -> (Self, Vec<WonCellAction>) {
        let won = Self {
            cell: cell.to_owned(),
            replica,
            node_id,
            step: Step::CatchingUp,
            dispatched: None,
            execution_count: serde_json::json!(0),
        };
        (won, vec![WonCellAction::CatchUp])
    }

    /// Where the cell is.
    pub fn step(&self) -> Step {
        self.step
    }

    /// What to do after `event`. An event the current step does not wait for changes nothing.
    pub fn on(&mut self, event: WonCellEvent) -> Vec<WonCellAction> {
        use WonCellAction as A;
        match (self.step, event) {
            (Step::CatchingUp, WonCellEvent::CaughtUp(Ok(()))) => {
                self.step = Step::Dispatching;
                vec![A::HoldReplyAndDispatch]
            }
            (Step::CatchingUp, WonCellEvent::CaughtUp(Err(e))) => {
                self.step = Step::Done;
                let evalue = format!("replica {} on host {} could not catch up: {e}", self.replica, self.node_id);
                let content = serde_json::json!({
                    "status": "error", "execution_count": 0, "ename": "NamespaceNotCaughtUp", "evalue": evalue,
                    "traceback": [format!("NamespaceNotCaughtUp: {evalue}")],
                });
                vec![A::AnswerNotRun { content }, A::ReleaseLock]
            }
            (Step::Dispatching, WonCellEvent::Dispatched(Ok(d))) => {
                self.step = Step::Running;
                self.dispatched = d;
                vec![A::AwaitReply]
            }
            (Step::Dispatching, WonCellEvent::Dispatched(Err(e))) => {
                self.step = Step::Done;
                vec![A::UnholdReply, A::RejectCell { ename: "KernelUnavailable", evalue: e }, A::ReleaseLock]
            }
            (Step::Running, WonCellEvent::Replied(Some(count))) => {
                self.step = Step::Exporting;
                self.execution_count = count;
                vec![A::ExportAndCommit]
            }
            (Step::Running, WonCellEvent::Replied(None)) => {
                self.step = Step::Done;
                vec![A::UnholdReply, A::ReleaseLock]
            }
            (Step::Exporting, WonCellEvent::Exported(Ok(x))) => {
                self.step = Step::Done;
                let mut actions = Vec::new();
                if !x.unpicklable.is_empty() {
                    let names: Vec<String> = x.unpicklable.iter().map(|u| format!("  {u}")).collect();
                    actions.push(A::Warn(format!(
                        "[NotebookOS] not synchronised to the other replicas (cannot be pickled); they will lack:\n{}\n",
                        names.join("\n")
                    )));
                }
                actions.push(A::ReleaseReply { revision: x.revision, dispatched: self.dispatched, content: None });
                actions
            }
            (Step::Exporting, WonCellEvent::Exported(Err(e))) => {
                self.step = Step::Done;
                let warning = format!(
                    "[NotebookOS] this cell's namespace changes were NOT synchronised to the other replicas: {e}\n"
                );
                // Not acknowledged: the cell ran here only. This replica's namespace now
                // differs from the group's, so it yields every later cell (another replica
                // runs them) until the supervisor has started its kernel afresh.
                let diverged = format!("cell {}'s changes could not be synchronised: {e}", self.cell);
                let evalue = format!(
                    "the cell ran on replica {} (host {}) but its namespace changes could not be synchronised to the \
                     other replicas ({e}); the kernel's next cells run on another replica, without this cell's changes",
                    self.replica, self.node_id
                );
                let content = serde_json::json!({
                    "status": "error", "execution_count": self.execution_count, "ename": "NamespaceSyncFailed",
                    "evalue": evalue, "traceback": [format!("NamespaceSyncFailed: {evalue}")],
                });
                vec![
                    A::Warn(warning),
                    A::MarkDiverged(diverged),
                    A::ReleaseLock,
                    A::ReleaseReply { revision: 0, dispatched: self.dispatched, content: Some(content) },
                ]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(us: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(us)
    }

    #[test]
    fn a_cell_that_runs_and_syncs_releases_the_reply_with_its_revision() {
        let (mut w, first) = WonCell::start("c", 2, 7);
        assert_eq!(first, vec![WonCellAction::CatchUp]);
        assert_eq!(w.on(WonCellEvent::CaughtUp(Ok(()))), vec![WonCellAction::HoldReplyAndDispatch]);
        let d = Dispatched { gpus_bound: Some(at(1)), written: at(2) };
        assert_eq!(w.on(WonCellEvent::Dispatched(Ok(Some(d)))), vec![WonCellAction::AwaitReply]);
        assert_eq!(w.on(WonCellEvent::Replied(Some(serde_json::json!(3)))), vec![WonCellAction::ExportAndCommit]);
        let x = Exported { revision: 42, unpicklable: vec![] };
        assert_eq!(
            w.on(WonCellEvent::Exported(Ok(x))),
            vec![WonCellAction::ReleaseReply { revision: 42, dispatched: Some(d), content: None }]
        );
        assert_eq!(w.step(), Step::Done);
    }

    #[test]
    fn unpicklable_names_are_warned_about_before_the_reply() {
        let (mut w, _) = WonCell::start("c", 1, 1);
        w.on(WonCellEvent::CaughtUp(Ok(())));
        w.on(WonCellEvent::Dispatched(Ok(None)));
        w.on(WonCellEvent::Replied(Some(serde_json::json!(1))));
        let x = Exported { revision: 5, unpicklable: vec!["f: cannot pickle".to_owned()] };
        let actions = w.on(WonCellEvent::Exported(Ok(x)));
        assert!(matches!(&actions[0], WonCellAction::Warn(t) if t.contains("  f: cannot pickle")));
        assert_eq!(actions[1], WonCellAction::ReleaseReply { revision: 5, dispatched: None, content: None });
    }

    #[test]
    fn a_failed_export_marks_the_replica_diverged_and_answers_an_error_with_the_count() {
        let (mut w, _) = WonCell::start("c", 1, 9);
        w.on(WonCellEvent::CaughtUp(Ok(())));
        w.on(WonCellEvent::Dispatched(Ok(None)));
        w.on(WonCellEvent::Replied(Some(serde_json::json!(4))));
        let actions = w.on(WonCellEvent::Exported(Err("store down".to_owned())));
        assert!(matches!(&actions[1], WonCellAction::MarkDiverged(m) if m.contains("cell c's changes")));
        assert_eq!(actions[2], WonCellAction::ReleaseLock);
        let WonCellAction::ReleaseReply { revision: 0, content: Some(c), .. } = &actions[3] else {
            panic!("no error reply: {actions:?}")
        };
        assert_eq!(c["ename"], "NamespaceSyncFailed");
        assert_eq!(c["execution_count"], 4);
    }

    #[test]
    fn a_namespace_that_cannot_catch_up_answers_without_running() {
        let (mut w, _) = WonCell::start("c", 3, 2);
        let actions = w.on(WonCellEvent::CaughtUp(Err("timed out".to_owned())));
        let WonCellAction::AnswerNotRun { content } = &actions[0] else { panic!("{actions:?}") };
        assert_eq!(content["ename"], "NamespaceNotCaughtUp");
        assert_eq!(actions[1], WonCellAction::ReleaseLock);
        assert_eq!(w.on(WonCellEvent::Dispatched(Ok(None))), vec![], "over: later events change nothing");
    }

    fn event() -> impl Strategy<Value = WonCellEvent> {
        prop_oneof![
            prop_oneof![Just(Ok(())), Just(Err("late".to_owned()))].prop_map(WonCellEvent::CaughtUp),
            prop_oneof![
                Just(Ok(None)),
                Just(Ok(Some(Dispatched { gpus_bound: None, written: SystemTime::UNIX_EPOCH }))),
                Just(Err("gone".to_owned())),
            ]
            .prop_map(WonCellEvent::Dispatched),
            prop_oneof![Just(None), Just(Some(serde_json::json!(1)))].prop_map(WonCellEvent::Replied),
            prop_oneof![Just(Ok(Exported { revision: 9, unpicklable: vec![] })), Just(Err("no".to_owned()))]
                .prop_map(WonCellEvent::Exported),
        ]
    }

    /// The answer the step `action` waits for, from a list of possible answers.
    fn answers(action: &WonCellAction) -> Option<u8> {
        match action {
            WonCellAction::CatchUp => Some(0),
            WonCellAction::HoldReplyAndDispatch => Some(1),
            WonCellAction::AwaitReply => Some(2),
            WonCellAction::ExportAndCommit => Some(3),
            _ => None,
        }
    }

    fn kind(e: &WonCellEvent) -> u8 {
        match e {
            WonCellEvent::CaughtUp(_) => 0,
            WonCellEvent::Dispatched(_) => 1,
            WonCellEvent::Replied(_) => 2,
            WonCellEvent::Exported(_) => 3,
        }
    }

    proptest! {
        /// Whatever each step comes to (and whatever stray events arrive between), the cell
        /// ends; it answers the front-end exactly once unless its kernel died, never twice;
        /// and the kernel's lock is released exactly once unless the commit removed it.
        #[test]
        fn every_won_cell_ends_with_one_answer_and_its_lock_released(events in proptest::collection::vec(event(), 0..40)) {
            let (mut w, mut pending) = WonCell::start("c", 1, 1);
            let mut all = pending.clone();
            let mut stray = events.into_iter();
            let mut committed = false;
            let mut died = false;
            let mut rounds = 0;
            while w.step() != Step::Done {
                rounds += 1;
                prop_assert!(rounds < 100, "the sequence does not end");
                // A stray event first (one the step does not wait for changes nothing),
                // then the answer to the step's action.
                if let Some(e) = stray.next() {
                    let waiting = pending.iter().find_map(answers);
                    if waiting != Some(kind(&e)) {
                        prop_assert!(w.on(e).is_empty());
                    } else {
                        committed = matches!(e, WonCellEvent::Exported(Ok(_)));
                        died = matches!(e, WonCellEvent::Replied(None));
                        pending = w.on(e);
                        all.extend(pending.clone());
                        continue;
                    }
                }
                let answer = match pending.iter().find_map(answers) {
                    Some(0) => WonCellEvent::CaughtUp(Ok(())),
                    Some(1) => WonCellEvent::Dispatched(Ok(None)),
                    Some(2) => WonCellEvent::Replied(Some(serde_json::json!(0))),
                    Some(_) => WonCellEvent::Exported(Ok(Exported { revision: 1, unpicklable: vec![] })),
                    None => return Err(TestCaseError::fail(format!("no step to wait for and not done: {pending:?}"))),
                };
                committed = matches!(answer, WonCellEvent::Exported(Ok(_)));
                pending = w.on(answer);
                all.extend(pending.clone());
            }
            let answered = all.iter().filter(|a| matches!(a,
                WonCellAction::ReleaseReply { .. } | WonCellAction::AnswerNotRun { .. } | WonCellAction::RejectCell { .. })).count();
            prop_assert_eq!(answered, usize::from(!died));
            let released = all.iter().filter(|a| matches!(a, WonCellAction::ReleaseLock)).count();
            prop_assert_eq!(released, usize::from(!committed));
            let unheld = all.iter().filter(|a| matches!(a, WonCellAction::UnholdReply)).count();
            prop_assert!(unheld <= 1);
        }
    }
}
