//! The endpoint file: what a running daemon tells local clients (`nbos`, the kernel
//! proxy, benches) about where its API is and where its token lives. The daemon writes it
//! in its runtime directory once it listens; clients read it when given no URL.

use std::path::PathBuf;

/// What a running node tells whoever started it, once it listens.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// Base URL of the HTTP API, as local clients reach it: the advertised URL in a cluster
    /// (the name in the host's certificate), else the listener with a wildcard address
    /// replaced by loopback.
    pub url: String,
    /// Process id of the daemon.
    pub pid: u32,
    /// File holding the API token, if the API needs one.
    pub token_file: Option<PathBuf>,
    /// Durable state directory.
    pub state_dir: PathBuf,
    /// The CA an https:// `url`'s certificate chains to (the cluster's), so local clients
    /// (`nbos`, the packaged kernelspecs' proxy) verify it with nothing configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

impl Endpoint {
    /// The URL local clients use for a daemon listening at `listen_url` (`http[s]://ADDR:PORT`)
    /// that other hosts reach at `advertise_url` (empty: none): the advertised one when set
    /// (a certificate names it, not a wildcard), else `listen_url` with an unspecified
    /// address (`0.0.0.0`, `[::]`) made loopback.
    pub fn local_url(listen_url: &str, advertise_url: &str) -> String {
        if !advertise_url.is_empty() {
            return advertise_url.trim_end_matches('/').to_owned();
        }
        listen_url.replacen("://0.0.0.0:", "://127.0.0.1:", 1).replacen("://[::]:", "://[::1]:", 1)
    }

    /// The CA to verify `url` with: this daemon's, when `url` is its own https:// URL.
    pub fn ca_for(&self, url: &str) -> Option<&std::path::Path> {
        self.ca_cert.as_deref().filter(|_| self.url == url && url.starts_with("https://"))
    }
}

/// Name of the file in `runtime_dir` where a running node describes its endpoint.
pub const ENDPOINT_FILE: &str = "endpoint.json";

/// Runtime directory of a packaged daemon (where its endpoint file lives).
pub fn default_runtime_dir() -> PathBuf {
    PathBuf::from("/run/notebookos")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listener_is_reached_on_loopback_and_an_advertised_url_wins() {
        assert_eq!(Endpoint::local_url("https://0.0.0.0:8888", ""), "https://127.0.0.1:8888");
        assert_eq!(Endpoint::local_url("http://[::]:8888", ""), "http://[::1]:8888");
        assert_eq!(Endpoint::local_url("http://10.0.0.2:8888", ""), "http://10.0.0.2:8888");
        assert_eq!(
            Endpoint::local_url("https://0.0.0.0:8888", "https://gpu-host-2.example:8888/"),
            "https://gpu-host-2.example:8888"
        );
    }

    #[test]
    fn the_ca_applies_to_the_daemons_own_https_url_only() {
        let e = Endpoint {
            url: "https://gpu-host-2.example:8888".into(),
            pid: 1,
            token_file: None,
            state_dir: "/var/lib/notebookos".into(),
            ca_cert: Some("/etc/notebookos/pki/ca.pem".into()),
        };
        assert_eq!(
            e.ca_for("https://gpu-host-2.example:8888"),
            Some(std::path::Path::new("/etc/notebookos/pki/ca.pem"))
        );
        assert_eq!(e.ca_for("https://elsewhere.example:8888"), None);
    }

    #[test]
    fn an_endpoint_file_of_the_version_before_still_reads() {
        let old = r#"{"url":"http://127.0.0.1:8888","pid":7,"token_file":null,"state_dir":"/var/lib/notebookos"}"#;
        let e: Endpoint = serde_json::from_str(old).expect("the old endpoint file");
        assert_eq!(e.ca_cert, None);
        assert_eq!(e.ca_for("http://127.0.0.1:8888"), None);
    }
}
