//! [`User`]: a person the API knows, as one identity source vouched for them.

use serde::{Deserialize, Serialize};

/// A user: the name kernels are owned by (and, with `kernel.run_as = "owner"`, the system
/// account they run as), and the groups quotas, fair-share weights and `auth.admin_group` name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct User {
    /// The user's name.
    pub name: String,
    /// The groups the user is a member of.
    pub groups: Vec<String>,
}

impl User {
    /// Whether the user is a member of `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}
