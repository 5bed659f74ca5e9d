//! [`Authenticator`]: resolves a request's credential (a token, a verified client
//! certificate) to a user, asking each configured identity source in turn. A source is one
//! [`IdentitySource`]; JupyterHub's and OIDC's plug in beside the users file's and the
//! client certificates' with [`Authenticator::push`].

use std::sync::Arc;

use rustls::pki_types::CertificateDer;

use super::caller::UserCaller;
use super::certificate::CertificateUsers;
use super::file::{UsersFile, UsersFileError};
use super::jupyterhub::{JupyterHubSetupError, JupyterHubVerifier};
use super::oidc::{OidcSetupError, OidcVerifier};
use super::source::{AuthError, IdentitySource};
use crate::config::{AuthConfig, Quota};

/// Why `[auth]`'s sources could not be set up (the daemon does not start).
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// `auth.users_file`.
    #[error(transparent)]
    UsersFile(#[from] UsersFileError),
    /// `auth.jupyterhub_*`.
    #[error(transparent)]
    JupyterHub(#[from] JupyterHubSetupError),
    /// `auth.oidc_*`.
    #[error(transparent)]
    Oidc(#[from] OidcSetupError),
}

/// The configured identity sources, in order, and who among their users is an admin.
pub struct Authenticator {
    sources: Vec<Arc<dyn IdentitySource>>,
    /// The users file, also for its entries' quotas and groups whatever source named the user.
    users_file: Option<Arc<UsersFile>>,
    admin_group: Option<String>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name()).collect();
        f.debug_struct("Authenticator").field("sources", &names).field("admin_group", &self.admin_group).finish()
    }
}

impl Authenticator {
    /// The sources `[auth]` configures, in the order they are asked: the users file, client
    /// certificates, OIDC (JWT-shaped tokens), JupyterHub; `None` when it configures no users.
    pub fn from_config(auth: &AuthConfig) -> Result<Option<Self>, AuthSetupError> {
        if !auth.has_users() {
            return Ok(None);
        }
        let users_file = auth.users_file.as_deref().map(UsersFile::load).transpose()?.map(Arc::new);
        let mut a = Self { sources: Vec::new(), users_file: users_file.clone(), admin_group: auth.admin_group.clone() };
        if let Some(f) = users_file {
            tracing::info!(users = f.len(), "auth.users_file loaded");
            a.push(f);
        }
        if auth.client_certificate_users {
            a.push(Arc::new(CertificateUsers));
        }
        if let Some(oidc) = OidcVerifier::from_config(auth)? {
            a.push(Arc::new(oidc));
        }
        if let Some(hub) = JupyterHubVerifier::from_config(auth)? {
            a.push(Arc::new(hub));
        }
        Ok(Some(a))
    }

    /// An authenticator over `sources` (tests, and sources built elsewhere).
    pub fn new(
        sources: Vec<Arc<dyn IdentitySource>>,
        users_file: Option<Arc<UsersFile>>,
        admin_group: Option<String>,
    ) -> Self {
        Self { sources, users_file, admin_group }
    }

    /// Adds a source, asked after those already there.
    pub fn push(&mut self, source: Arc<dyn IdentitySource>) {
        self.sources.push(source);
    }

    /// The user the credential names: the first source that knows it answers.
    pub async fn identify(
        &self,
        token: Option<&str>,
        cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<UserCaller>, AuthError> {
        for source in &self.sources {
            if let Some(mut user) = source.identify(token, cert).await? {
                let entry = self.users_file.as_ref().and_then(|f| f.get(&user.name));
                // A users-file entry of the same name adds its groups and its quota.
                if let Some(e) = entry {
                    for g in &e.user.groups {
                        if !user.in_group(g) {
                            user.groups.push(g.clone());
                        }
                    }
                }
                let quota = entry.map(|e| e.quota.clone()).unwrap_or_default();
                let admin = self.admin_group.as_deref().is_some_and(|g| user.in_group(g));
                tracing::debug!(user = %user.name, source = source.name(), admin, "caller identified");
                return Ok(Some(UserCaller { user, admin, quota }));
            }
        }
        Ok(None)
    }

    /// The users-file entry quota of `name` (empty when none).
    pub fn quota_of(&self, name: &str) -> Quota {
        self.users_file.as_ref().and_then(|f| f.get(name)).map(|e| e.quota.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use async_trait::async_trait;
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::users::User;

    struct Fixed(&'static str, Result<Option<User>, AuthError>);

    #[async_trait]
    impl IdentitySource for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        async fn identify(
            &self,
            _t: Option<&str>,
            _c: Option<&CertificateDer<'static>>,
        ) -> Result<Option<User>, AuthError> {
            self.1.clone()
        }
    }

    #[tokio::test]
    async fn sources_are_asked_in_order_and_the_users_file_adds_groups_and_quota() {
        let text = format!(
            "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\ngroups = [\"admins\"]\ngpus = 3\n",
            hex::encode(Sha256::digest(b"alice-token"))
        );
        let file = Arc::new(UsersFile::parse(&text, Path::new("users.toml")).expect("file"));
        let hub_alice = User { name: "alice".into(), groups: vec!["ml".into()] };
        let a = Authenticator::new(
            vec![Arc::new(Fixed("none", Ok(None))), Arc::new(Fixed("hub", Ok(Some(hub_alice))))],
            Some(file.clone()),
            Some("admins".into()),
        );
        let got = a.identify(Some("whatever"), None).await.expect("ok").expect("alice");
        assert_eq!(got.user.groups, vec!["ml".to_owned(), "admins".to_owned()]);
        assert!(got.admin);
        assert_eq!(got.quota.gpus, Some(3));

        let failing = Authenticator::new(
            vec![Arc::new(Fixed("down", Err(AuthError::Unavailable("hub".into())))), file],
            None,
            None,
        );
        assert!(matches!(failing.identify(Some("alice-token"), None).await, Err(AuthError::Unavailable(_))));
    }
}
