//! Who calls the API: users (a name and groups) from the configured sources (`[auth]`).

pub mod account_name;
pub mod jupyterhub;
pub mod oidc;
pub mod token_cache;
mod user;

pub use user::User;
