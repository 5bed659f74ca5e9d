//! Who calls the API: users (a name and groups) from the configured sources (`[auth]`).

mod user;

pub use user::User;
