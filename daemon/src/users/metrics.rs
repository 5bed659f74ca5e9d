//! Per-user metrics with a bounded number of label values: the first
//! [`MAX_LABELLED_USERS`] users this process sees get their own `user` label, everyone after
//! them is `user="other"`, so a cluster of thousands of users cannot blow up the series count.
//! Process-wide (the refusing code does not all hold the daemon's metrics), appended to
//! `/metrics` with [`UserMetrics::append_to`].

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How many users get a label of their own.
pub const MAX_LABELLED_USERS: usize = 100;

/// The label of users past [`MAX_LABELLED_USERS`].
pub const OTHER_USERS: &str = "other";

/// Labels of `notebookos_user_kernels`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UserLabels {
    /// The user (or `other`).
    pub user: String,
}

/// Labels of `notebookos_user_refusals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UserRefusalLabels {
    /// The user (or `other`).
    pub user: String,
    /// `not_found` (someone else's kernel), `quota_kernels`, `quota_gpus`, `kernels_per_token`, …
    pub reason: String,
}

/// The per-user metrics and the users that have a label.
pub struct UserMetrics {
    labelled: Mutex<HashSet<String>>,
    max: usize,
    kernels: Family<UserLabels, Gauge>,
    refusals: Family<UserRefusalLabels, Counter>,
    audit_write_errors: Counter,
    registry: Registry,
}

static METRICS: LazyLock<UserMetrics> = LazyLock::new(|| UserMetrics::new(MAX_LABELLED_USERS));

/// This process's per-user metrics.
pub fn user_metrics() -> &'static UserMetrics {
    &METRICS
}

impl UserMetrics {
    /// Metrics labelling at most `max` users by name.
    pub fn new(max: usize) -> Self {
        let kernels = Family::<UserLabels, Gauge>::default();
        let refusals = Family::<UserRefusalLabels, Counter>::default();
        let audit_write_errors = Counter::default();
        let mut registry = Registry::default();
        registry.register(
            "notebookos_user_kernels",
            "Kernels each user owns (the cluster's, counted at the scrape; user=\"other\" past the first 100 users)",
            kernels.clone(),
        );
        registry.register(
            "notebookos_user_refusals",
            "Requests of each user refused by ownership or a quota, by reason",
            refusals.clone(),
        );
        registry.register(
            "notebookos_audit_write_errors",
            "Audit log lines that could not be written (auth.audit_log)",
            audit_write_errors.clone(),
        );
        Self { labelled: Mutex::default(), max, kernels, refusals, audit_write_errors, registry }
    }

    /// The `user` label of `name`: its own while fewer than the bound have one, else `other`.
    pub fn label(&self, name: &str) -> String {
        let mut set = self.labelled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.contains(name) {
            return name.to_owned();
        }
        if set.len() < self.max {
            set.insert(name.to_owned());
            return name.to_owned();
        }
        OTHER_USERS.to_owned()
    }

    /// Sets `notebookos_user_kernels{user}` from the owners of the kernels that exist now
    /// (one entry per kernel); users past the bound add up under `other`.
    pub fn set_kernels<'a>(&self, owners: impl IntoIterator<Item = &'a str>) {
        let mut counts: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
        for owner in owners {
            *counts.entry(self.label(owner)).or_default() += 1;
        }
        self.kernels.clear();
        for (user, n) in counts {
            self.kernels.get_or_create(&UserLabels { user }).set(n);
        }
    }

    /// Counts one refusal of `user`'s request.
    pub fn count_refusal(&self, user: &str, reason: &str) {
        let labels = UserRefusalLabels { user: self.label(user), reason: reason.to_owned() };
        self.refusals.get_or_create(&labels).inc();
    }

    /// `notebookos_user_refusals_total{user,reason}` so far.
    pub fn refusals(&self, user: &str, reason: &str) -> u64 {
        self.refusals.get_or_create(&UserRefusalLabels { user: self.label(user), reason: reason.to_owned() }).get()
    }

    /// Counts an audit line that could not be written.
    pub fn count_audit_write_error(&self) {
        self.audit_write_errors.inc();
    }

    /// `notebookos_audit_write_errors_total` so far.
    pub fn audit_write_errors(&self) -> u64 {
        self.audit_write_errors.get()
    }

    /// Appends these metrics to a `/metrics` exposition.
    pub fn append_to(&self, exposition: &mut String) {
        crate::metrics::append_registry(&self.registry, exposition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_users_get_their_own_label() {
        let m = UserMetrics::new(3);
        for i in 0..10 {
            m.count_refusal(&format!("user{i}"), "not_found");
        }
        assert_eq!(m.refusals("user0", "not_found"), 1);
        assert_eq!(m.refusals("user2", "not_found"), 1);
        assert_eq!(m.label("user3"), OTHER_USERS);
        assert_eq!(m.refusals("user9", "not_found"), 7, "users 3..9 share the other label");
        let mut text = String::from("# EOF\n");
        m.append_to(&mut text);
        let users: HashSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("notebookos_user_refusals_total{"))
            .filter_map(|l| l.split("user=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(users, HashSet::from(["user0", "user1", "user2", "other"]), "{text}");
        m.set_kernels(["user0", "user0", "user7", "user8"]);
        let mut text = String::from("# EOF\n");
        m.append_to(&mut text);
        assert!(text.contains("notebookos_user_kernels{user=\"user0\"} 2"), "{text}");
        assert!(text.contains("notebookos_user_kernels{user=\"other\"} 2"), "{text}");
    }
}
