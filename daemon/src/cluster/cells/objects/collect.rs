//! The collector's rule, apart from any store or clock: an object may be deleted when no
//! replica refers to it and it was last written more than the grace period ago.
//!
//! The grace period is what keeps an object a replica still needs while nobody's state
//! shows it: one written for a cell whose pointer is not committed yet, one a lagging
//! replica or a learner catching up from a raft snapshot will read, one an operator's
//! `gc` races with. It must be longer than a replica's longest catch-up.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::store::StoredObject;

/// A count of objects and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Objects.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, o: &StoredObject) {
        self.objects += 1;
        self.bytes += o.size;
    }

    /// The tally of `objects`.
    pub fn of<'a>(objects: impl IntoIterator<Item = &'a StoredObject>) -> Tally {
        let mut t = Tally::default();
        for o in objects {
            t.add(o);
        }
        t
    }
}

/// A listing sorted by the rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sorted {
    /// Objects some replica refers to.
    pub referenced: Tally,
    /// Objects no one refers to, written within the grace period: kept for now.
    pub recent: Tally,
    /// Objects no one refers to, written before the grace period: may go.
    pub collectable: Vec<StoredObject>,
    /// Objects referred to that are not in the store (a replica applying them fails).
    pub dangling: u64,
}

/// Whether `object`, referred to by no replica, is old enough to delete at `now`.
pub fn past_grace(object: &StoredObject, now: SystemTime, grace: Duration) -> bool {
    // A modification time in the future (clock skew between the store and this host)
    // counts as now: kept.
    now.duration_since(object.modified).is_ok_and(|age| age >= grace)
}

/// Sorts `listing` by `referenced` (every replica's pointers) at `now`.
pub fn sort(listing: &[StoredObject], referenced: &BTreeSet<String>, now: SystemTime, grace: Duration) -> Sorted {
    let mut out = Sorted::default();
    let mut present = BTreeSet::new();
    for o in listing {
        present.insert(o.sha256.as_str());
        if referenced.contains(&o.sha256) {
            out.referenced.add(o);
        } else if past_grace(o, now, grace) {
            out.collectable.push(o.clone());
        } else {
            out.recent.add(o);
        }
    }
    out.dangling = referenced.iter().filter(|r| !present.contains(r.as_str())).count() as u64;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(n: u8, size: u64, modified: SystemTime) -> StoredObject {
        StoredObject { sha256: format!("{n:064x}"), size, modified }
    }

    #[test]
    fn only_unreferenced_objects_older_than_the_grace_period_go() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let grace = Duration::from_secs(3600);
        let old = now - Duration::from_secs(7200);
        let listing = vec![
            object(1, 10, old),                           // referenced: kept
            object(2, 20, old),                           // unreferenced, old: goes
            object(3, 30, now - Duration::from_secs(60)), // unreferenced, recent: kept
            object(4, 40, now + Duration::from_secs(60)), // in the future (skew): kept
            object(5, 50, now - grace),                   // exactly the grace: goes
        ];
        let referenced: BTreeSet<String> = [format!("{:064x}", 1), format!("{:064x}", 9)].into_iter().collect();
        let s = sort(&listing, &referenced, now, grace);
        assert_eq!(s.referenced, Tally { objects: 1, bytes: 10 });
        assert_eq!(s.recent, Tally { objects: 2, bytes: 70 });
        let gone: Vec<u64> = s.collectable.iter().map(|o| o.size).collect();
        assert_eq!(gone, vec![20, 50]);
        assert_eq!(s.dangling, 1, "object 9 is referred to but not stored");
        assert_eq!(Tally::of(&s.collectable), Tally { objects: 2, bytes: 70 });
    }

    #[test]
    fn with_no_grace_every_unreferenced_object_goes_and_references_always_win() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(50);
        let listing = vec![object(1, 1, now), object(2, 2, SystemTime::UNIX_EPOCH)];
        let everything: BTreeSet<String> = listing.iter().map(|o| o.sha256.clone()).collect();
        assert!(sort(&listing, &everything, now, Duration::ZERO).collectable.is_empty());
        assert_eq!(sort(&listing, &BTreeSet::new(), now, Duration::ZERO).collectable.len(), 2);
    }
}
