//! `auth.client_certificate_users`: a client certificate the TLS handshake verified names
//! its user by its subject's Common Name. A host's certificate (`node-<id>`) names no user.

use async_trait::async_trait;
use rustls::pki_types::CertificateDer;
use x509_cert::der::asn1::{Ia5StringRef, PrintableStringRef, Utf8StringRef};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode, Tag, Tagged};

use super::account_name::{check_user_name, HOST_PREFIX};
use super::source::{AuthError, IdentitySource};
use super::User;

/// `commonName` (X.520).
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// The Common Name of `cert`'s subject (the first, if several).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let cert = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    for rdn in cert.tbs_certificate.subject.0.iter() {
        for atv in rdn.0.iter() {
            if atv.oid != COMMON_NAME {
                continue;
            }
            let v = &atv.value;
            let text = match v.tag() {
                Tag::Utf8String => v.decode_as::<Utf8StringRef<'_>>().ok().map(|s| s.as_str().to_owned()),
                Tag::PrintableString => v.decode_as::<PrintableStringRef<'_>>().ok().map(|s| s.as_str().to_owned()),
                Tag::Ia5String => v.decode_as::<Ia5StringRef<'_>>().ok().map(|s| s.as_str().to_owned()),
                _ => None,
            };
            return text;
        }
    }
    None
}

/// Users named by their client certificates. Groups come from the users file when it has
/// an entry of that name (the authenticator adds them), else none.
#[derive(Debug, Default)]
pub struct CertificateUsers;

#[async_trait]
impl IdentitySource for CertificateUsers {
    fn name(&self) -> &'static str {
        "client_certificate"
    }

    async fn identify(
        &self,
        _token: Option<&str>,
        cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<User>, AuthError> {
        let Some(cert) = cert else { return Ok(None) };
        let Some(cn) = common_name(cert) else {
            return Err(AuthError::Refused("the client certificate names no user (no Common Name)".into()));
        };
        // Hosts are never users, whatever else a node certificate says.
        if cn.starts_with(HOST_PREFIX) {
            return Ok(None);
        }
        if let Err(why) = check_user_name(&cn) {
            return Err(AuthError::Refused(format!("the client certificate's Common Name is not a user's: {why}")));
        }
        Ok(Some(User { name: cn, groups: Vec::new() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("certificate").der().clone()
    }

    #[tokio::test]
    async fn a_certificate_names_its_user_and_a_host_names_none() {
        let alice = CertificateUsers.identify(None, Some(&cert("alice"))).await.expect("ok");
        assert_eq!(alice, Some(User { name: "alice".into(), groups: vec![] }));
        assert_eq!(CertificateUsers.identify(None, Some(&cert("node-1"))).await.expect("ok"), None);
        let bad = CertificateUsers.identify(None, Some(&cert("Alice Smith"))).await;
        assert!(matches!(bad, Err(AuthError::Refused(_))), "{bad:?}");
        assert_eq!(CertificateUsers.identify(Some("a-token"), None).await.expect("ok"), None);
    }

    #[tokio::test]
    async fn a_certificate_naming_the_daemons_own_callers_is_refused() {
        for cn in ["operator", "anonymous", "unknown", "other"] {
            let refused = CertificateUsers.identify(None, Some(&cert(cn))).await;
            assert!(
                matches!(refused, Err(AuthError::Refused(ref why)) if why.contains("not users")),
                "{cn}: {refused:?}"
            );
        }
        let dotted = CertificateUsers.identify(None, Some(&cert("j.doe"))).await.expect("ok");
        assert_eq!(dotted.map(|u| u.name), Some("j.doe".to_owned()));
    }
}
