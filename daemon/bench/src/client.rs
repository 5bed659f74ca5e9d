//! How `nbos` finds and talks to the local daemon.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use notebookosd::link::endpoint::{Endpoint, ENDPOINT_FILE};

/// Where the daemon is and how to authenticate, as given on the command line or
/// in the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Base URL of the daemon's API. Default: the local daemon's endpoint file, else http://127.0.0.1:8888.
    #[arg(long, global = true, env = "NBOS_URL")]
    pub url: Option<String>,
    /// Refused: a token on the command line is readable by every local user
    /// (`/proc/PID/cmdline`). Kept, hidden, to say what to use instead.
    #[arg(long = "token", global = true, hide = true, value_name = "TOKEN")]
    pub token_in_argv: Option<String>,
    /// File whose first line is the API token; or set NBOS_TOKEN to the token itself.
    /// Default: the token file the local daemon names.
    #[arg(long, global = true, env = "NBOS_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) an https:// daemon's certificate must chain to (the cluster CA).
    #[arg(long, global = true, env = "NBOS_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) to present to an https:// daemon (with --client-key, --ca-cert).
    #[arg(long, global = true, env = "NBOS_CLIENT_CERT", value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "NBOS_CLIENT_KEY", value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Refused, like `--token`.
    #[arg(long = "operator-token", global = true, hide = true, value_name = "TOKEN")]
    pub operator_token_in_argv: Option<String>,
    /// File whose first line is the operator token (membership, drain, re-placement:
    /// `nbos cluster join|leave`); or set NBOS_OPERATOR_TOKEN to the token itself.
    #[arg(long, global = true, env = "NBOS_OPERATOR_TOKEN_FILE", value_name = "FILE")]
    pub operator_token_file: Option<PathBuf>,
}

/// The environment variable that carries the API token itself.
pub const TOKEN_ENV: &str = "NBOS_TOKEN";
/// The environment variable that carries the operator token itself.
pub const OPERATOR_TOKEN_ENV: &str = "NBOS_OPERATOR_TOKEN";

impl ConnectArgs {
    /// Refuses a secret given on the command line, where every local user can read it.
    pub fn check(&self) -> anyhow::Result<()> {
        let refuse = |flag: &str, env: &str| {
            anyhow::anyhow!(
                "{flag} puts a secret on the command line, where every local user can read it \
                 (/proc/PID/cmdline); set {env} or pass {flag}-file FILE instead"
            )
        };
        if self.token_in_argv.is_some() {
            return Err(refuse("--token", TOKEN_ENV));
        }
        if self.operator_token_in_argv.is_some() {
            return Err(refuse("--operator-token", OPERATOR_TOKEN_ENV));
        }
        Ok(())
    }

    /// The API token: `--token-file` (or NBOS_TOKEN_FILE), else NBOS_TOKEN; `None` when
    /// neither is given (the local daemon's endpoint file may name one).
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        self.check()?;
        secret(self.token_file.as_deref(), TOKEN_ENV)
    }

    /// The operator token: `--operator-token-file` (or NBOS_OPERATOR_TOKEN_FILE), else
    /// NBOS_OPERATOR_TOKEN.
    pub fn operator_token(&self) -> anyhow::Result<Option<String>> {
        self.check()?;
        secret(self.operator_token_file.as_deref(), OPERATOR_TOKEN_ENV)
    }

    /// An HTTP agent that speaks TLS as these options say: the default web roots when no
    /// --ca-cert is given, else servers must chain to it (and --client-cert is presented).
    pub fn agent(&self, timeout: Duration) -> anyhow::Result<ureq::Agent> {
        let mut builder = ureq::AgentBuilder::new().timeout(timeout);
        match (&self.ca_cert, &self.client_cert, &self.client_key) {
            (Some(ca), cert, key) => {
                let identity = cert.as_deref().zip(key.as_deref());
                builder = builder.tls_config(notebookosd::link::tls::client_config(ca, identity)?);
            }
            (None, Some(_), _) => {
                anyhow::bail!("--client-cert needs --ca-cert (the CA the daemon's certificate chains to)")
            }
            (None, None, _) => {}
        }
        Ok(builder.build())
    }
}

/// A token from `file` (its first line), else from the environment variable `env`.
fn secret(file: Option<&std::path::Path>, env: &str) -> anyhow::Result<Option<String>> {
    if let Some(f) = file {
        return notebookosd::link::token::read_token_file(f).map(Some);
    }
    match std::env::var(env) {
        Ok(t) if !t.trim().is_empty() => Ok(Some(t.trim().to_owned())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("{env} is not valid UTF-8"),
    }
}

/// Runtime directory of a packaged daemon.
const DEFAULT_RUNTIME_DIR: &str = "/run/notebookos";

/// A resolved daemon address and token.
#[derive(Debug, Clone)]
pub struct Client {
    /// Base URL without a trailing slash.
    pub url: String,
    token: Option<String>,
    operator_token: Option<String>,
    agent: ureq::Agent,
    /// Overrides the agent's 10 s for every request ([`Client::with_timeout`]).
    timeout: Option<Duration>,
}

impl Client {
    /// Resolves `--url` and the token (`--token-file`, NBOS_TOKEN), falling back to the local daemon's endpoint file.
    pub fn new(target: &ConnectArgs) -> anyhow::Result<Self> {
        let endpoint = read_endpoint(&PathBuf::from(DEFAULT_RUNTIME_DIR).join(ENDPOINT_FILE));
        let url = match (&target.url, &endpoint) {
            (Some(u), _) => u.clone(),
            (None, Some(e)) => e.url.clone(),
            (None, None) => "http://127.0.0.1:8888".to_owned(),
        };
        let token = match (target.token()?, &endpoint) {
            (Some(t), _) => Some(t),
            (None, Some(Endpoint { token_file: Some(f), url, .. }))
                if target.url.as_deref().is_none_or(|u| u == url) =>
            {
                std::fs::read_to_string(f).ok().and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
            }
            _ => None,
        };
        // The local daemon's own URL: verified against the CA its endpoint file names, unless
        // --ca-cert says otherwise.
        let endpoint_ca =
            endpoint.as_ref().filter(|_| target.ca_cert.is_none()).and_then(|e| e.ca_for(&url)).map(Into::into);
        let agent = match endpoint_ca {
            Some(ca) => ConnectArgs { ca_cert: Some(ca), ..target.clone() }.agent(Duration::from_secs(10))?,
            None => target.agent(Duration::from_secs(10))?,
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            token,
            operator_token: target.operator_token()?,
            agent,
            timeout: None,
        })
    }

    /// The same daemon, authenticating as the operator (membership, drain, re-placement).
    pub fn as_operator(&self) -> anyhow::Result<Self> {
        let token = self.operator_token.clone().context(
            "this command needs the operator token: set NBOS_OPERATOR_TOKEN or pass --operator-token-file \
             (the daemon's http.operator_token_file)",
        )?;
        Ok(Self { token: Some(token), ..self.clone() })
    }

    /// The same client, waiting up to `timeout` for each answer: for calls the daemon bounds
    /// itself beyond the default 10 s (a membership change that first hands off the meta
    /// group's leadership).
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self { timeout: Some(timeout), ..self.clone() }
    }

    /// The same daemon credentials against another host of the cluster (same token).
    pub fn with_url(&self, url: &str) -> Self {
        Self { url: url.trim_end_matches('/').to_owned(), ..self.clone() }
    }

    /// `GET path` and decode the JSON body.
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send_json("GET", path, None)
    }

    /// `POST path` with a JSON body and decode the JSON answer.
    pub fn post_json<T: serde::de::DeserializeOwned>(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<T> {
        self.send_json("POST", path, Some(body))
    }

    /// `method path` (with an optional JSON body) and decode the JSON answer; an error
    /// answer's `message` is the error.
    pub fn send_json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<T> {
        let mut req = self.agent.request(method, &format!("{}{path}", self.url));
        if let Some(t) = self.timeout {
            req = req.timeout(t);
        }
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("token {t}"));
        }
        let res = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(&b.to_string()),
            None => req.call(),
        };
        match res {
            Ok(resp) => resp.into_json().with_context(|| format!("decoding the answer of {method} {}{path}", self.url)),
            Err(ureq::Error::Status(401, _)) => {
                anyhow::bail!("the daemon at {} refused the token (401): set NBOS_TOKEN or pass --token-file", self.url)
            }
            Err(ureq::Error::Status(403, resp)) => {
                let body = resp.into_string().unwrap_or_default();
                Err(anyhow::Error::new(HttpStatus { code: 403, message: body.trim().to_owned() }))
                    .with_context(|| format!("the daemon at {} refused {method} {path} (403)", self.url))
            }
            Err(ureq::Error::Status(code, resp)) => {
                let body = resp.into_string().unwrap_or_default();
                let message = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                    .unwrap_or_else(|| body.trim().to_owned());
                Err(anyhow::Error::new(HttpStatus { code, message }))
                    .with_context(|| format!("{method} {}{path} failed", self.url))
            }
            Err(e) => Err(anyhow::anyhow!(e)).with_context(|| {
                format!("cannot reach notebookosd at {} (is it running? set --url or NBOS_URL)", self.url)
            }),
        }
    }
}

/// An error answer of the daemon (kept in the error chain so callers can match the code).
#[derive(Debug, thiserror::Error)]
#[error("HTTP {code}: {message}")]
pub struct HttpStatus {
    /// The status code.
    pub code: u16,
    /// The daemon's message.
    pub message: String,
}

fn read_endpoint(path: &std::path::Path) -> Option<Endpoint> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}
