//! The API's credentials: the users' token (configured, generated, or none on a token-less
//! loopback API), the operator token, and how this host proves itself to other hosts.

use std::path::PathBuf;

use anyhow::Context;

use super::fs::write_file_atomically;
use crate::config::Config;
use crate::link::credential::Credentials;

/// Name of the file in `runtime_dir` holding a generated API token.
pub const GENERATED_TOKEN_FILE: &str = "api-token";

/// The API's credentials and the file holding the users' token (none on a token-less API).
/// Sets this process's operator token and, for a cluster host without node certificates,
/// the token hosts call each other with.
pub(super) fn credentials(config: &Config) -> anyhow::Result<(Credentials, Option<PathBuf>)> {
    let (token, token_file) = api_token(config)?;
    let credentials = Credentials {
        token: token.clone(),
        operator_token: config
            .http
            .operator_token_file
            .as_deref()
            .map(crate::link::token::read_token_file)
            .transpose()
            .context("reading http.operator_token_file")?,
        // Hosts prove themselves with node certificates when every host has one (cluster.tls)
        // and verifies them (http.tls.client_ca); see `set_host_identity`.
        node_certificates: config.cluster.tls.is_some()
            && config.http.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        authenticator: crate::users::Authenticator::from_config(&config.auth)
            .context("loading [auth]'s users")?
            .map(std::sync::Arc::new),
    };
    if credentials.operator_token.is_some() && credentials.operator_token == token {
        anyhow::bail!("http.operator_token_file must hold a different token from http.token_file");
    }
    if let Some(t) = &credentials.operator_token {
        crate::link::host::set_operator_token(t.clone());
    }
    if config.cluster.enabled && !credentials.node_certificates {
        // No certificates to check: hosts call each other with the operator token, never
        // with the users' (which would let any notebook user act as a host).
        match &credentials.operator_token {
            Some(t) => {
                crate::link::host::set_fallback_token(t.clone());
            }
            None if token.is_some() || credentials.authenticator.is_some() => anyhow::bail!(
                "a cluster host needs node certificates (cluster.tls and http.tls.client_ca) or, \
                 without them, http.operator_token_file: hosts never call each other with the users' token"
            ),
            None => {}
        }
    }
    Ok((credentials, token_file))
}

/// The token clients must present, and the file it lives in.
fn api_token(config: &Config) -> anyhow::Result<(Option<String>, Option<PathBuf>)> {
    if let Some(path) = &config.http.token_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading http.token_file {}", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim().to_owned();
        anyhow::ensure!(
            token.len() >= 16,
            "http.token_file {}: the token must be at least 16 characters",
            path.display()
        );
        return Ok((Some(token), Some(path.clone())));
    }
    if config.auth.has_users() {
        // Users hold their own credentials: no shared token to generate (a configured one
        // is refused on the users' routes, see `link::credential`).
        return Ok((None, None));
    }
    if config.http.listen.ip().is_loopback() && config.http.allow_unauthenticated_loopback {
        tracing::warn!(listen = %config.http.listen, "API open without a token (loopback only)");
        return Ok((None, None));
    }
    // Loopback without a configured token: generate one readable only by root, as Jupyter does.
    let path = config.node.runtime_dir.join(GENERATED_TOKEN_FILE);
    let token = random_token()?;
    write_file_atomically(&path, format!("{token}\n").as_bytes())?;
    Ok((Some(token), Some(path)))
}

/// 32 random bytes, hex-encoded.
fn random_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom for an API token")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
