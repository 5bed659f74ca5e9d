//! Who calls the API: users (a name and groups) from the configured sources (`[auth]`).
//!
//! - [`user`]: [`User`], what every source returns; [`caller`]: [`Caller`], who made a request.
//! - [`authenticator`]: the sources in order; [`source`]: [`IdentitySource`], one of them;
//!   [`file`]: `auth.users_file`;
//!   [`certificate`]: `auth.client_certificate_users`; [`jupyterhub`]: JupyterHub API tokens;
//!   [`oidc`]: OIDC bearer JWTs ([`token_cache`] remembers verified tokens by digest;
//!   [`token_sources`] makes both sources of the authenticator).
//! - [`audit`]: `auth.audit_log`; [`metrics`]: per-user metrics with bounded labels.

pub mod account_name;
pub mod audit;
pub mod authenticator;
pub mod caller;
pub mod certificate;
pub mod file;
pub mod jupyterhub;
pub mod metrics;
pub mod oidc;
pub mod source;
pub mod token_cache;
pub mod token_sources;
mod user;

pub use authenticator::{AuthSetupError, Authenticator};
pub use caller::{Caller, UserCaller};
pub use source::{AuthError, IdentitySource};
pub use user::User;
