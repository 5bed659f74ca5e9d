//! `[auth]`: who the API's callers are (users, their groups, admins) and the audit log.
//! Each identity source is optional; with none, the API has its one users' token as before.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[auth]`: where users come from (`docs/users.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// TOML file of `[[user]]` entries: `name`, `token_sha256` (hex SHA-256 of the user's
    /// token; no token is stored in clear), `groups`, and optional per-user quotas.
    pub users_file: Option<PathBuf>,
    /// JupyterHub's API (e.g. `http://hub:8081/hub/api`): a request's token is a user's
    /// JupyterHub API token, checked with the Hub's `GET /user`.
    pub jupyterhub_api_url: Option<String>,
    /// The file holding this service's own JupyterHub API token (reads users' groups).
    pub jupyterhub_token_file: Option<PathBuf>,
    /// How long a token the Hub vouched for is trusted without asking again.
    #[serde(with = "humantime_serde")]
    pub jupyterhub_cache: Duration,
    /// OIDC: the issuer (`iss`) bearer JWTs must name.
    pub oidc_issuer: Option<String>,
    /// OIDC: the audience (`aud`) bearer JWTs must name.
    pub oidc_audience: Option<String>,
    /// OIDC: where the issuer's signing keys (JWKS) are.
    pub oidc_jwks_url: Option<String>,
    /// OIDC: the claim naming the user.
    pub oidc_username_claim: String,
    /// OIDC: the claim listing the user's groups.
    pub oidc_groups_claim: String,
    /// A verified client certificate (`http.tls.client_ca`) names its user by its Common
    /// Name, so a certificate is a user's identity rather than a key to everything.
    pub client_certificate_users: bool,
    /// The group whose members see and act on every kernel.
    pub admin_group: Option<String>,
    /// One JSON line per kernel action and per refusal.
    pub audit_log: Option<PathBuf>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            users_file: None,
            jupyterhub_api_url: None,
            jupyterhub_token_file: None,
            jupyterhub_cache: Duration::from_secs(60),
            oidc_issuer: None,
            oidc_audience: None,
            oidc_jwks_url: None,
            oidc_username_claim: "preferred_username".to_owned(),
            oidc_groups_claim: "groups".to_owned(),
            client_certificate_users: false,
            admin_group: None,
            audit_log: None,
        }
    }
}

impl AuthConfig {
    /// Some source of users is configured: the API then knows who calls, every kernel has
    /// an owner, and `http.token_file` is optional.
    pub fn has_users(&self) -> bool {
        self.users_file.is_some()
            || self.jupyterhub_api_url.is_some()
            || self.oidc_issuer.is_some()
            || self.client_certificate_users
    }
}

/// Quotas of one user, or of one group's members together (`[limits]`, `[limits.groups.NAME]`,
/// or a users-file entry). `None`: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quota {
    /// Kernels that exist at once.
    pub kernels: Option<u32>,
    /// GPUs committed at once: the GPUs per cell of the kernels that exist, together.
    pub gpus: Option<u32>,
    /// GPU-hours of cells per day (UTC).
    pub gpu_hours_per_day: Option<f64>,
}

/// `[limits.groups.NAME]`: a group's quota (its members together) and its fair-share weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupLimits {
    /// The group's members together.
    #[serde(flatten)]
    pub quota: Quota,
    /// The share of contended GPUs a member is entitled to, relative to a weight-1 user.
    pub weight: f64,
}

impl Default for GroupLimits {
    fn default() -> Self {
        Self { quota: Quota::default(), weight: 1.0 }
    }
}
