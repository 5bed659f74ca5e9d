//! JupyterHub's and OIDC's verifiers as [`IdentitySource`]s of the [`super::Authenticator`].
//!
//! Order matters: the users file is asked first (a hash lookup, no network), then OIDC for a
//! token shaped like a JWT (only a JWT can be one), then the Hub for anything else. A token
//! the Hub does not know names nobody (the request is refused as a wrong token); a JWT or a
//! Hub token that is refused for what it says (forged, expired, a service's) stops the search.

use async_trait::async_trait;
use rustls::pki_types::CertificateDer;

use super::jupyterhub::{JupyterHubError, JupyterHubRefusal, JupyterHubVerifier};
use super::oidc::{OidcError, OidcVerifier};
use super::source::{AuthError, IdentitySource};
use super::User;

/// Whether `token` has a JWT's shape: three base64url parts, the first a JSON header.
pub fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

#[async_trait]
impl IdentitySource for JupyterHubVerifier {
    fn name(&self) -> &'static str {
        "jupyterhub"
    }

    async fn identify(
        &self,
        token: Option<&str>,
        _cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<User>, AuthError> {
        let Some(token) = token else { return Ok(None) };
        match self.verify(token).await {
            Ok(user) => Ok(Some(user)),
            Err(JupyterHubError::Refused(JupyterHubRefusal::UnknownToken)) => Ok(None),
            Err(e @ JupyterHubError::Refused(_)) => Err(AuthError::Refused(e.to_string())),
            Err(JupyterHubError::Unavailable(why)) => Err(AuthError::Unavailable(format!("JupyterHub: {why}"))),
        }
    }
}

#[async_trait]
impl IdentitySource for OidcVerifier {
    fn name(&self) -> &'static str {
        "oidc"
    }

    async fn identify(
        &self,
        token: Option<&str>,
        _cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<User>, AuthError> {
        let Some(token) = token.filter(|t| looks_like_jwt(t)) else { return Ok(None) };
        match self.verify(token).await {
            Ok(user) => Ok(Some(user)),
            Err(e @ OidcError::Refused(_)) => Err(AuthError::Refused(e.to_string())),
            Err(OidcError::Unavailable(why)) => Err(AuthError::Unavailable(format!("OIDC: {why}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::looks_like_jwt;

    #[test]
    fn only_jwt_shaped_tokens_go_to_the_oidc_issuer() {
        assert!(looks_like_jwt("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"));
        for not in ["", "a.b.c", "eyJ.x", "eyJhbGciOiJ9.e30.sig.extra", "0123456789abcdef", "eyJhbGci.e30.s=g"] {
            assert!(!looks_like_jwt(not), "{not}");
        }
    }
}
