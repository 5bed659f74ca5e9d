//! Mutual TLS between nodes: rustls configs from PEM files, and a generator for a cluster PKI.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::{Error, Result};

/// The DNS name a node's certificate must carry.
pub fn node_name(node_id: u64) -> String {
    format!("node-{node_id}")
}

/// TLS client and server configuration of one node.
#[derive(Clone)]
pub(crate) struct TlsPair {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Tls(format!("read certificates from {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{} holds no certificate", path.display())));
    }
    Ok(certs)
}

pub(crate) fn load(ca: &Path, cert: &Path, key: &Path) -> Result<TlsPair> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c).map_err(|e| Error::Tls(format!("CA certificate {}: {e}", ca.display())))?;
    }
    let roots = Arc::new(roots);
    let chain = load_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::Tls(format!("read private key from {}: {e}", key.display())))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| Error::Tls(format!("client verifier: {e}")))?;
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| Error::Tls(format!("server certificate {}: {e}", cert.display())))?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| Error::Tls(format!("client certificate {}: {e}", cert.display())))?;
    Ok(TlsPair {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
    })
}

/// True when the (already chain-verified) certificate names `node-<id>`.
pub(crate) fn cert_names_node(cert: &CertificateDer<'_>, node_id: u64) -> bool {
    let Ok(name) = ServerName::try_from(node_name(node_id)) else { return false };
    webpki::EndEntityCert::try_from(cert).is_ok_and(|c| c.verify_is_valid_for_subject_name(&name).is_ok())
}

/// Paths of one node's TLS material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTlsFiles {
    /// CA certificate (PEM).
    pub ca_cert: PathBuf,
    /// Node certificate (PEM).
    pub cert: PathBuf,
    /// Node private key (PEM, mode 0600).
    pub key: PathBuf,
}

impl NodeTlsFiles {
    /// The files [`generate_cluster_pki`] writes for `node_id` in `dir`.
    pub fn in_dir(dir: &Path, node_id: u64) -> Self {
        NodeTlsFiles {
            ca_cert: dir.join("ca.pem"),
            cert: dir.join(format!("{}.pem", node_name(node_id))),
            key: dir.join(format!("{}.key", node_name(node_id))),
        }
    }

    /// As transport security configuration.
    pub fn security(&self) -> crate::config::TransportSecurity {
        crate::config::TransportSecurity::MutualTls {
            ca_cert: self.ca_cert.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// Writes a fresh CA (`ca.pem`; its key is not kept) and, for each node, `node-<id>.pem` and
/// `node-<id>.key` into `dir`. For tests, benchmarks and development clusters; production
/// deployments bring certificates from their own CA.
pub fn generate_cluster_pki(dir: &Path, node_ids: &[u64]) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
    let tls = |e: rcgen::Error| Error::Tls(format!("generate certificates: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "notebookos raft CA");
    let ca_key = KeyPair::generate().map_err(tls)?;
    let ca = ca_params.self_signed(&ca_key).map_err(tls)?;
    write(&dir.join("ca.pem"), ca.pem().as_bytes(), false)?;
    for id in node_ids {
        let mut params = CertificateParams::new(vec![node_name(*id)]).map_err(tls)?;
        params.distinguished_name.push(DnType::CommonName, node_name(*id));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().map_err(tls)?;
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(tls)?;
        let files = NodeTlsFiles::in_dir(dir, *id);
        write(&files.cert, cert.pem().as_bytes(), false)?;
        write(&files.key, key.serialize_pem().as_bytes(), true)?;
    }
    Ok(())
}

fn write(path: &Path, data: &[u8], secret: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    f.write_all(data).map_err(|e| Error::io(format!("write {}", path.display()), e))
}
