//! A cluster's own PKI in a directory: one CA, node certificates (raft transport *and*
//! HTTPS listener *and* host-to-host client), and client certificates (jupyter_server's
//! gateway client, operators). `nbos pki` and the tests use it; production may bring
//! certificates from its own CA instead, with the same names (`node-<id>` SANs).
//!
//! Files in the directory: `ca.pem`, `ca.key` (0600, kept to issue more), and per
//! certificate `<name>.pem` + `<name>.key` (0600), where `<name>` is `node-<id>` or
//! `client-<name>`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};

/// Why a PKI operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Certificate generation or parsing failed.
    #[error("{0}")]
    Cert(String),
    /// `init` on a directory that already holds a CA (it would orphan every issued cert).
    #[error("{0} already holds a CA (ca.pem); refusing to replace it")]
    CaExists(PathBuf),
    /// A client name that is not a plain label.
    #[error("client name {0:?} must be 1-64 characters of [A-Za-z0-9_.-]")]
    BadName(String),
}

/// The CA's subject. Fixed, so that [`Pki::issuer`] can rebuild the issuer from `ca.key`
/// alone (rcgen signs with the issuer's DN and key; both are what `ca.pem` holds).
const CA_COMMON_NAME: &str = "notebookos cluster CA";

/// A PKI directory.
#[derive(Debug, Clone)]
pub struct Pki {
    dir: PathBuf,
}

/// The two files of an issued certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Private key (PEM, 0600).
    pub key: PathBuf,
}

impl Pki {
    /// The PKI in `dir` (nothing is read yet).
    pub fn at(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    /// `ca.pem`.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `ca.key`.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// Creates the directory (0700) and a fresh CA in it.
    pub fn init(&self) -> Result<(), PkiError> {
        create_private_dir(&self.dir)?;
        if self.ca_cert().exists() {
            return Err(PkiError::CaExists(self.dir.clone()));
        }
        let key = KeyPair::generate().map_err(cert_err)?;
        let ca = ca_params()?.self_signed(&key).map_err(cert_err)?;
        write(&self.ca_key(), key.serialize_pem().as_bytes(), true)?;
        write(&self.ca_cert(), ca.pem().as_bytes(), false)
    }

    /// Issues `node-<id>`: SAN `node-<id>` (what raft peers and hosts check) plus `dns` and
    /// `ips` (the names clients use for this host's HTTPS listener); usable as server and client.
    pub fn issue_node(&self, node_id: u64, dns: &[String], ips: &[IpAddr]) -> Result<Issued, PkiError> {
        let name = node_name(node_id);
        let mut sans = vec![name.clone()];
        sans.extend(dns.iter().cloned());
        let mut params = CertificateParams::new(sans).map_err(cert_err)?;
        params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name.push(DnType::CommonName, name.clone());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&name, params)
    }

    /// Issues `client-<name>`: a client certificate (jupyter_server, an operator's tools).
    pub fn issue_client(&self, name: &str) -> Result<Issued, PkiError> {
        let ok = (1..=64).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            return Err(PkiError::BadName(name.to_owned()));
        }
        let file = format!("client-{name}");
        // No DNS SAN: a client certificate must never pass for a node (`node-<id>`).
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&file, params)
    }

    fn sign(&self, file: &str, params: CertificateParams) -> Result<Issued, PkiError> {
        let (ca, ca_key) = self.issuer()?;
        let key = KeyPair::generate().map_err(cert_err)?;
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(cert_err)?;
        let issued = Issued { cert: self.dir.join(format!("{file}.pem")), key: self.dir.join(format!("{file}.key")) };
        write(&issued.key, key.serialize_pem().as_bytes(), true)?;
        write(&issued.cert, cert.pem().as_bytes(), false)?;
        Ok(issued)
    }

    /// The CA as rcgen's issuer, rebuilt from `ca.key` and the fixed subject.
    fn issuer(&self) -> Result<(Certificate, KeyPair), PkiError> {
        let path = self.ca_key();
        let pem = std::fs::read_to_string(&path).map_err(|source| PkiError::Io {
            what: "reading the CA key (run `nbos pki init` first)",
            path: path.clone(),
            source,
        })?;
        let key = KeyPair::from_pem(&pem).map_err(|e| PkiError::Cert(format!("CA key {}: {e}", path.display())))?;
        let ca = ca_params()?.self_signed(&key).map_err(cert_err)?;
        Ok((ca, key))
    }
}

/// The DNS SAN a node's certificate carries (the raft transport's rule).
pub fn node_name(node_id: u64) -> String {
    raft_store::transport::tls::node_name(node_id)
}

fn ca_params() -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, CA_COMMON_NAME);
    Ok(p)
}

fn cert_err(e: rcgen::Error) -> PkiError {
    PkiError::Cert(format!("certificate generation: {e}"))
}

fn create_private_dir(dir: &Path) -> Result<(), PkiError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|source| PkiError::Io {
        what: "creating",
        path: dir.to_owned(),
        source,
    })
}

fn write(path: &Path, data: &[u8], secret: bool) -> Result<(), PkiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| PkiError::Io { what: "writing", path: path.to_owned(), source };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(io)?;
    f.write_all(data).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn issued_certificates_chain_to_the_ca_and_keys_are_private() {
        let dir = tempfile::tempdir().expect("tmp");
        let pki = Pki::at(&dir.path().join("pki"));
        pki.init().expect("init");
        assert!(matches!(pki.init(), Err(PkiError::CaExists(_))));
        let node = pki.issue_node(3, &["h3.example".into()], &["127.0.0.1".parse().expect("ip")]).expect("node");
        let client = pki.issue_client("jupyter").expect("client");
        assert!(matches!(pki.issue_client("../x"), Err(PkiError::BadName(_))));
        for key in [pki.ca_key(), node.key.clone(), client.key.clone()] {
            let mode = std::fs::metadata(&key).expect("key").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let tls = crate::link::tls::TlsFiles { ca_cert: pki.ca_cert(), cert: node.cert, key: node.key };
        let cert = tls.end_entity_cert().expect("node cert");
        assert!(crate::link::tls::chains_to(&cert, &pki.ca_cert()).expect("verify"));
        assert!(crate::link::tls::cert_names_node(&cert, 3));
        assert!(!crate::link::tls::cert_names_node(&cert, 4));
        let client = crate::link::tls::TlsFiles { ca_cert: pki.ca_cert(), cert: client.cert, key: client.key };
        let cert = client.end_entity_cert().expect("client cert");
        assert!(crate::link::tls::chains_to(&cert, &pki.ca_cert()).expect("verify"));
        assert!(!crate::link::tls::cert_names_node(&cert, 3));
    }
}
