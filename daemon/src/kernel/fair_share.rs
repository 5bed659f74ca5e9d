//! The fair share of this host's contended GPUs, the daemon side of
//! [`nbos_sched::fairshare`]: who owns each kernel (an injected [`OwnerLookup`]), each
//! owner's recent GPU time (GPU-seconds committed to their cells, decayed), and the order
//! the binder's waiting cells go in.
//!
//! Without users every kernel is the one anonymous user ([`Anonymous`]): the order is
//! first come first served, as before.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use nbos_sched::fairshare::{self, Ledger, Params, Waiting};
use nbos_sched::{KernelId, Millis};

use crate::config::{GroupLimits, LimitsConfig};
use crate::users::User;

/// A kernel's owner as the fair share needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The user's name.
    pub user: String,
    /// The user's weight: the largest of their groups' ([`weight_of`]), 1 by default.
    pub weight: f64,
}

/// Who owns a kernel. Called under the binder's lock: it must answer from memory (the
/// kernel's record) and never call back into the binder.
pub trait OwnerLookup: Send + Sync {
    /// The owner of `kernel_id`.
    fn owner(&self, kernel_id: &str) -> Owner;

    /// The owner of `kernel_id` as a user (name and groups), when it has one: whose
    /// `gpu_hours_per_day` its cells count against. None by default.
    fn user(&self, _kernel_id: &str) -> Option<User> {
        None
    }
}

/// Every kernel is one anonymous user of weight 1: a cluster without users.
#[derive(Debug, Default)]
pub struct Anonymous;

impl OwnerLookup for Anonymous {
    fn owner(&self, _kernel_id: &str) -> Owner {
        Owner { user: fairshare::ANONYMOUS.to_owned(), weight: 1.0 }
    }
}

/// The owners of this host's kernels, as the registry starts and forgets them (a
/// single-host kernel's API caller, a replica's kernel record's owner). A kernel it does not
/// know (none configured, a kernel without owner) is the anonymous user.
#[derive(Debug)]
pub struct KernelOwners {
    /// `[limits.groups]`: the weights.
    groups: BTreeMap<String, GroupLimits>,
    owners: RwLock<HashMap<String, User>>,
}

impl KernelOwners {
    /// No kernel yet; weights from `limits`' groups.
    pub fn new(limits: &LimitsConfig) -> Self {
        Self { groups: limits.groups.clone(), owners: RwLock::new(HashMap::new()) }
    }

    /// `kernel_id` is `user`'s.
    pub fn set(&self, kernel_id: &str, user: &User) {
        // A poisoned lock still holds a usable map: a panic elsewhere must not stop the GPUs.
        self.owners
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(kernel_id.to_owned(), user.clone());
    }

    /// `kernel_id` is gone.
    pub fn forget(&self, kernel_id: &str) {
        self.owners.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(kernel_id);
    }

    /// Kernels with an owner (a bound: it must not outgrow the kernels).
    pub fn len(&self) -> usize {
        self.owners.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// No kernel has an owner.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl OwnerLookup for KernelOwners {
    fn owner(&self, kernel_id: &str) -> Owner {
        let owners = self.owners.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match owners.get(kernel_id) {
            Some(u) => Owner { user: u.name.clone(), weight: weight_of(&u.groups, &self.groups) },
            None => Anonymous.owner(kernel_id),
        }
    }

    fn user(&self, kernel_id: &str) -> Option<User> {
        self.owners.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(kernel_id).cloned()
    }
}

/// A user's weight: the largest `weight` of their groups in `[limits.groups.NAME]`; 1 when
/// none of their groups has one (or a weight is not a positive number).
pub fn weight_of(groups: &[String], weights: &BTreeMap<String, GroupLimits>) -> f64 {
    groups
        .iter()
        .filter_map(|g| weights.get(g))
        .map(|g| g.weight)
        .filter(|w| w.is_finite() && *w > 0.0)
        .fold(None, |best: Option<f64>, w| Some(best.map_or(w, |b| b.max(w))))
        .unwrap_or(1.0)
}

/// The fair-share state of one host's binder.
pub(crate) struct FairShare {
    enabled: bool,
    /// `gpu.fair_share_headroom`.
    headroom: bool,
    params: Params,
    lookup: Arc<dyn OwnerLookup>,
    ledger: Ledger,
    /// Owners looked up, by kernel (forgotten with the kernel).
    owners: HashMap<KernelId, Owner>,
    /// Running cells' owners and GPUs, by cell.
    running: HashMap<String, (String, u32)>,
}

impl FairShare {
    /// On, with the default half-life, every kernel anonymous.
    pub(crate) fn new() -> Self {
        Self::with(true, Duration::from_millis(fairshare::DEFAULT_HALF_LIFE_MS), Arc::new(Anonymous))
    }

    pub(crate) fn with(enabled: bool, half_life: Duration, lookup: Arc<dyn OwnerLookup>) -> Self {
        let half_life_ms = Millis::try_from(half_life.as_millis()).unwrap_or(Millis::MAX).max(1);
        Self {
            enabled,
            headroom: false,
            params: Params { half_life_ms, ..Params::default() },
            lookup,
            ledger: Ledger::new(half_life_ms),
            owners: HashMap::new(),
            running: HashMap::new(),
        }
    }

    fn owner(&mut self, kernel: &str) -> Owner {
        if let Some(o) = self.owners.get(kernel) {
            return o.clone();
        }
        let o = self.lookup.owner(kernel);
        self.owners.insert(kernel.to_owned(), o.clone());
        o
    }

    /// `cell` of `kernel` was committed `gpus` GPUs at `now`: its owner's GPU time counts.
    pub(crate) fn started(&mut self, kernel: &str, cell: &str, gpus: u32, now: Millis) {
        let user = self.owner(kernel).user;
        self.ledger.take(&user, gpus, now);
        self.running.insert(cell.to_owned(), (user, gpus));
    }

    /// `cell` gave its GPUs back (it ended, or its kernel died or restarted).
    pub(crate) fn ended(&mut self, cell: &str, now: Millis) {
        if let Some((user, gpus)) = self.running.remove(cell) {
            self.ledger.give_back(&user, gpus, now);
        }
    }

    /// The kernel is gone: its owner is looked up again should the id come back.
    pub(crate) fn forget(&mut self, kernel: &str, now: Millis) {
        self.owners.remove(kernel);
        // Users idle for about 20 half-lives have under a GPU-second left: forgotten.
        self.ledger.forget_idle(now, fairshare::DEFAULT_BAND_GPU_MS);
    }

    /// Keep headroom (`gpu.fair_share_headroom`) or not.
    pub(crate) fn set_headroom(&mut self, on: bool) {
        self.headroom = on;
    }

    /// The GPUs a cell of `kernel` must leave free on this host, whose kernels are `kernels`
    /// (id, GPUs declared, a cell running): [`fairshare::headroom`] of their owners; 0 when
    /// fair share or its headroom is off.
    pub(crate) fn headroom(&mut self, kernel: &str, kernels: &[(KernelId, u32, bool)], now: Millis) -> u32 {
        if !self.enabled || !self.headroom {
            return 0;
        }
        let me = self.owner(kernel);
        let owners: Vec<(Owner, u32, bool)> =
            kernels.iter().map(|(k, gpus, running)| (self.owner(k), *gpus, *running)).collect();
        let on_host: Vec<fairshare::OnHost<'_>> = owners
            .iter()
            .map(|(o, gpus, running)| fairshare::OnHost {
                user: &o.user,
                weight: o.weight,
                gpus: *gpus,
                running: *running,
            })
            .collect();
        fairshare::headroom(&me.user, me.weight, &on_host, &self.ledger, now, &self.params)
    }

    /// The fair-share order of `queued` (kernels with when their cell was submitted), or
    /// `None` when fair share is off.
    pub(crate) fn order(&mut self, queued: &[(KernelId, Millis)], now: Millis) -> Option<Vec<KernelId>> {
        if !self.enabled || queued.len() < 2 {
            return None;
        }
        let owners: Vec<Owner> = queued.iter().map(|(k, _)| self.owner(k)).collect();
        let waiting: Vec<Waiting<'_>> = owners
            .iter()
            .zip(queued)
            .map(|(o, (_, at))| Waiting { user: &o.user, weight: o.weight, arrival: *at })
            .collect();
        let order = fairshare::order(&waiting, &self.ledger, now, &self.params);
        Some(order.into_iter().map(|i| queued[i].0.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::GroupLimits;

    #[test]
    fn a_users_weight_is_their_heaviest_groups() {
        let limits = LimitsConfig {
            groups: BTreeMap::from([
                ("staff".to_owned(), GroupLimits { weight: 2.0, ..GroupLimits::default() }),
                ("lab".to_owned(), GroupLimits { weight: 3.0, ..GroupLimits::default() }),
                ("odd".to_owned(), GroupLimits { weight: -1.0, ..GroupLimits::default() }),
            ]),
            ..LimitsConfig::default()
        };
        let g = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(weight_of(&g(&["staff", "lab", "other"]), &limits.groups), 3.0);
        assert_eq!(weight_of(&g(&["other"]), &limits.groups), 1.0);
        assert_eq!(weight_of(&g(&["odd"]), &limits.groups), 1.0, "a weight that is not positive counts as none");
    }

    #[test]
    fn the_owner_book_names_a_kernels_owner_and_weight_until_it_is_forgotten() {
        let limits = LimitsConfig {
            groups: BTreeMap::from([("lab".to_owned(), GroupLimits { weight: 4.0, ..GroupLimits::default() })]),
            ..LimitsConfig::default()
        };
        let book = KernelOwners::new(&limits);
        assert_eq!(book.owner("k1").user, fairshare::ANONYMOUS, "a kernel without owner");
        book.set("k1", &User { name: "alice".into(), groups: vec!["lab".into()] });
        book.set("k2", &User { name: "bob".into(), groups: vec![] });
        assert_eq!(book.owner("k1"), Owner { user: "alice".into(), weight: 4.0 });
        assert_eq!(book.owner("k2"), Owner { user: "bob".into(), weight: 1.0 });
        book.forget("k1");
        assert_eq!(book.owner("k1").user, fairshare::ANONYMOUS);
        assert_eq!(book.len(), 1, "a forgotten kernel leaves nothing behind");
    }

    struct Table(HashMap<&'static str, &'static str>);
    impl OwnerLookup for Table {
        fn owner(&self, kernel_id: &str) -> Owner {
            Owner { user: self.0.get(kernel_id).copied().unwrap_or("").to_owned(), weight: 1.0 }
        }
    }

    #[test]
    fn a_light_users_cell_is_put_before_a_heavy_users_earlier_ones() {
        let lookup = Table(HashMap::from([("h0", "heavy"), ("h1", "heavy"), ("h2", "heavy"), ("l1", "light")]));
        let mut f = FairShare::with(true, Duration::from_secs(3600), Arc::new(lookup));
        f.started("h0", "c0", 4, 0);
        f.ended("c0", 600_000);
        let queued = vec![("h1".to_owned(), 600_001), ("h2".to_owned(), 600_002), ("l1".to_owned(), 600_003)];
        assert_eq!(f.order(&queued, 600_010), Some(vec!["l1".to_owned(), "h1".to_owned(), "h2".to_owned()]));
        let mut off = FairShare::with(false, Duration::from_secs(3600), Arc::new(Anonymous));
        assert_eq!(off.order(&queued, 600_010), None, "off: the queue keeps its order");
        let mut anonymous = FairShare::new();
        anonymous.started("h0", "c0", 4, 0);
        assert_eq!(
            anonymous.order(&queued, 600_010),
            Some(vec!["h1".to_owned(), "h2".to_owned(), "l1".to_owned()]),
            "one user: first come first served"
        );
    }
}
