//! [`IdentitySource`]: one place users come from (the users file, client certificates,
//! JupyterHub, OIDC), as the [`super::Authenticator`] asks each in turn.

use async_trait::async_trait;
use rustls::pki_types::CertificateDer;

use super::User;

/// Why a source could not say who a credential is.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// The credential is the source's kind but not valid (a forged JWT, a certificate
    /// naming no user): refused (401), no later source is asked.
    #[error("{0}")]
    Refused(String),
    /// The source cannot answer now (the Hub is down): 503, the client may retry.
    #[error("identity source unavailable: {0}")]
    Unavailable(String),
}

/// One place users come from.
#[async_trait]
pub trait IdentitySource: Send + Sync {
    /// For logs: `users_file`, `client_certificate`, `jupyterhub`, `oidc`.
    fn name(&self) -> &'static str;

    /// The user `token` (a presented API token) or `cert` (a verified client certificate)
    /// names; `Ok(None)` when this source does not know the credential (the next one is asked).
    async fn identify(
        &self,
        token: Option<&str>,
        cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<User>, AuthError>;
}
