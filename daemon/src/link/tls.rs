//! TLS of the HTTP API, both ends: the listener's rustls config (with optional client
//! certificates verified against `http.tls.client_ca`), the clients' config (the `nbos`
//! CLI, host-to-host calls with the node certificate), and what a verified peer
//! certificate says (`node-<id>`: a host of the cluster).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A certificate, its key, and the CA that vouches for the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate (PEM) the peer's certificate must chain to.
    pub ca_cert: PathBuf,
    /// Own certificate chain (PEM).
    pub cert: PathBuf,
    /// Own private key (PEM).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The first certificate of `cert` (this side's end-entity certificate).
    pub fn end_entity_cert(&self) -> anyhow::Result<CertificateDer<'static>> {
        load_certs(&self.cert)?
            .into_iter()
            .next()
            .with_context(|| format!("{} holds no certificate", self.cert.display()))
    }
}

/// The verified client certificate of a connection (absent when the client sent none).
#[derive(Debug, Clone)]
pub struct ClientCertificate(pub Arc<CertificateDer<'static>>);

/// Who is at the other end of a connection (handlers get it as `ConnectInfo<Peer>`).
#[derive(Debug, Clone)]
pub struct Peer {
    /// Remote address.
    pub addr: std::net::SocketAddr,
    /// The client certificate the TLS handshake verified against `http.tls.client_ca`.
    pub client_cert: Option<ClientCertificate>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Certificates of a PEM file (at least one).
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("reading the private key from {}", path.display()))
}

fn roots(ca: &Path) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c).with_context(|| format!("CA certificate {}", ca.display()))?;
    }
    Ok(Arc::new(roots))
}

/// The listener's config: `cert`/`key`, and when `client_ca` is set, client certificates
/// are *asked for* and, when sent, must chain to it (else the handshake fails). A client
/// without one still connects and must present the token instead.
pub fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<Arc<ServerConfig>> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .allow_unauthenticated()
                .build()
                .with_context(|| format!("client certificate verifier for {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .with_context(|| format!("server certificate {} with key {}", cert.display(), key.display()))?;
    // HTTP/1.1 only: the Jupyter WebSockets are HTTP/1.1 upgrades.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's config: servers must chain to `ca`; `identity` (cert, key) is presented
/// when the server asks.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> anyhow::Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .with_context(|| format!("client certificate {} with key {}", cert.display(), key.display()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// True when the (already chain-verified) certificate names `node-<id>`: it belongs to
/// host `id` of the cluster (the raft transport's rule).
pub fn cert_names_node(cert: &CertificateDer<'_>, node_id: u64) -> bool {
    let Ok(name) = ServerName::try_from(raft_store::transport::tls::node_name(node_id)) else { return false };
    webpki::EndEntityCert::try_from(cert).is_ok_and(|c| c.verify_is_valid_for_subject_name(&name).is_ok())
}

/// True when `cert` is a client certificate that chains to the CA in `ca` (as the listener checks).
pub fn chains_to(cert: &CertificateDer<'static>, ca: &Path) -> anyhow::Result<bool> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider()).build()?;
    Ok(verifier.verify_client_cert(cert, &[], UnixTime::now()).is_ok())
}
