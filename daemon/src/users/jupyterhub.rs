//! [`JupyterHubVerifier`]: a user's JupyterHub API token (a single-user server sends its
//! `JUPYTERHUB_API_TOKEN` as `GatewayClient.auth_token`) turned into a [`User`] by asking the
//! Hub who holds it (`GET {jupyterhub_api_url}/user`, JupyterHub ≥ 2).
//!
//! What the Hub's scopes count for: the token must grant access to its owner's own servers
//! (`access:servers`, `access:servers!user=NAME` or `access:servers!server=NAME/…`, as the
//! Hub lists the token's expanded scopes). Running code in a kernel is what a user's server
//! does, so a token its owner narrowed to less (say `read:users:activity` for a dashboard)
//! does not run code here. A single-user server's own token has `access:servers!server` by
//! default (the Hub's `server` role), and a token from the Hub's token page inherits the
//! user's `access:servers!user`.
//!
//! The Hub's `admin` flag is not read: who administers NotebookOS is `auth.admin_group`'s to say.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Semaphore;

use super::account_name::{check_user_name, UserNameError};
use super::token_cache::TokenCache;
use super::User;
use crate::config::AuthConfig;

/// How long one request to the Hub may take, connection to last byte.
pub const HUB_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refusal is remembered: a token the Hub has just issued is not refused for longer.
pub const REFUSAL_CACHE: Duration = Duration::from_secs(5);
/// The most verified tokens remembered at once.
pub const CACHE_CAPACITY: usize = 4096;
/// The most refused tokens remembered at once. Refusals are kept apart from verified users:
/// anyone can make up distinct bad tokens, and they must not push the users' answers out.
pub const REFUSAL_CACHE_CAPACITY: usize = 1024;
/// The most questions to the Hub at once. Anyone can present a token the daemon has not seen,
/// and each one costs a Hub request of up to [`HUB_TIMEOUT`] on a blocking thread; past this
/// bound a new token is answered 503 at once (the client may retry) rather than queued.
pub const HUB_LOOKUPS: usize = 16;
/// The largest answer read from the Hub (a user model is a few KiB; groups make it more).
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// The Hub's verifier could not be set up from `[auth]` (the daemon does not start).
#[derive(Debug, thiserror::Error)]
pub enum JupyterHubSetupError {
    /// `auth.jupyterhub_api_url` is not an http(s) URL.
    #[error("auth.jupyterhub_api_url {url:?} is not an http:// or https:// URL")]
    BadUrl {
        /// The configured value.
        url: String,
    },
    /// `auth.jupyterhub_token_file` could not be read.
    #[error("reading auth.jupyterhub_token_file {}: {source}", path.display())]
    ReadTokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `auth.jupyterhub_token_file` may be read (or changed) by other accounts.
    #[error(
        "auth.jupyterhub_token_file {} has mode {mode:o}: other accounts may read the service's token; chmod 600 it",
        path.display()
    )]
    TokenFileExposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// `auth.jupyterhub_token_file` holds no token.
    #[error("auth.jupyterhub_token_file {} is empty", path.display())]
    EmptyTokenFile {
        /// The file.
        path: PathBuf,
    },
}

/// The Hub's answer refuses the token: the request is unauthenticated (HTTP 401). Remembered
/// for [`REFUSAL_CACHE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JupyterHubRefusal {
    /// The Hub does not know the token (or it expired, or was revoked).
    #[error("JupyterHub does not know this token")]
    UnknownToken,
    /// The token is a JupyterHub service's, not a user's.
    #[error("the token belongs to JupyterHub {kind} {name:?}, not to a user")]
    NotAUser {
        /// The Hub's `kind` (e.g. `service`).
        kind: String,
        /// The owner's name.
        name: String,
    },
    /// The Hub's user name cannot be a user's here (not an account name, or one the daemon
    /// uses for itself).
    #[error("JupyterHub's user name is refused: {0}")]
    UnsafeName(UserNameError),
    /// The token does not grant access to its owner's servers.
    #[error("the token of JupyterHub user {name:?} lacks access:servers to their own servers")]
    NoServerAccess {
        /// The owner's name.
        name: String,
    },
}

/// Why a JupyterHub token gave no [`User`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum JupyterHubError {
    /// The token is refused: HTTP 401.
    #[error(transparent)]
    Refused(#[from] JupyterHubRefusal),
    /// The Hub could not be asked, or gave no usable answer (down, 5xx, timeout, an answer
    /// that is not a user model, a user's groups it would not list), or [`HUB_LOOKUPS`] questions
    /// are already under way: HTTP 503. Never cached.
    #[error("JupyterHub unavailable: {0}")]
    Unavailable(String),
}

impl JupyterHubError {
    /// A short stable label (metrics, audit): `unknown_token`, `not_a_user`, `unsafe_name`,
    /// `no_server_access`, `hub_unavailable`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(JupyterHubRefusal::UnknownToken) => "unknown_token",
            Self::Refused(JupyterHubRefusal::NotAUser { .. }) => "not_a_user",
            Self::Refused(JupyterHubRefusal::UnsafeName(_)) => "unsafe_name",
            Self::Refused(JupyterHubRefusal::NoServerAccess { .. }) => "no_server_access",
            Self::Unavailable(_) => "hub_unavailable",
        }
    }
}

/// Checks users' JupyterHub API tokens with the Hub, remembering answers by token digest.
pub struct JupyterHubVerifier {
    /// The Hub's API, without a trailing `/` (e.g. `http://hub:8081/hub/api`).
    api_url: String,
    /// This service's own token: reads a user's groups when `GET /user` does not list them.
    service_token: Option<String>,
    agent: ureq::Agent,
    /// How long a verified token is trusted (`auth.jupyterhub_cache`).
    trust_for: Duration,
    /// Verified tokens' users, for `trust_for`.
    verified: Mutex<TokenCache<User>>,
    /// Refused tokens, for [`REFUSAL_CACHE`] (a cache of their own: see [`REFUSAL_CACHE_CAPACITY`]).
    refused: Mutex<TokenCache<JupyterHubRefusal>>,
    /// [`HUB_LOOKUPS`] permits to ask the Hub. Shared with the blocking task that asks, which
    /// holds its permit until the Hub answers even when the request that started it is gone.
    lookups: Arc<Semaphore>,
}

impl std::fmt::Debug for JupyterHubVerifier {
    // By hand: the service token stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JupyterHubVerifier")
            .field("api_url", &self.api_url)
            .field("service_token", &self.service_token.as_ref().map(|_| "<redacted>"))
            .field("trust_for", &self.trust_for)
            .finish_non_exhaustive()
    }
}

/// The part of the Hub's user (or service) model this verifier reads.
#[derive(Debug, Deserialize)]
struct HubModel {
    name: String,
    kind: String,
    /// Listed when the token (or the Hub's identify scopes) may read the user's groups.
    groups: Option<Vec<String>>,
    /// The token's expanded scopes (`GET /user` only).
    #[serde(default)]
    scopes: Vec<String>,
}

impl JupyterHubVerifier {
    /// The verifier `[auth]` configures: `None` without `jupyterhub_api_url`. Reads
    /// `jupyterhub_token_file` now, once, refusing a file other accounts may read.
    pub fn from_config(auth: &AuthConfig) -> Result<Option<Self>, JupyterHubSetupError> {
        let Some(api_url) = &auth.jupyterhub_api_url else { return Ok(None) };
        let service_token = auth.jupyterhub_token_file.as_deref().map(read_service_token).transpose()?;
        Self::new(api_url, service_token, auth.jupyterhub_cache).map(Some)
    }

    /// A verifier of tokens with the Hub at `api_url`, trusting a verified token for `trust_for`.
    pub fn new(
        api_url: &str,
        service_token: Option<String>,
        trust_for: Duration,
    ) -> Result<Self, JupyterHubSetupError> {
        let bad_url = || JupyterHubSetupError::BadUrl { url: api_url.to_owned() };
        let parsed = url::Url::parse(api_url).map_err(|_| bad_url())?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad_url());
        }
        // No redirects: the user's token must not follow one to another host.
        let agent = ureq::AgentBuilder::new().timeout(HUB_TIMEOUT).redirects(0).build();
        Ok(Self {
            api_url: api_url.trim_end_matches('/').to_owned(),
            service_token,
            agent,
            trust_for,
            verified: Mutex::new(TokenCache::new(CACHE_CAPACITY)),
            refused: Mutex::new(TokenCache::new(REFUSAL_CACHE_CAPACITY)),
            lookups: Arc::new(Semaphore::new(HUB_LOOKUPS)),
        })
    }

    /// The user who holds `token`, from the cache or else from the Hub. A refusal is cached
    /// for [`REFUSAL_CACHE`], a user for `auth.jupyterhub_cache`; the Hub unavailable is not.
    /// A token not cached while [`HUB_LOOKUPS`] questions are under way is unavailable at once.
    pub async fn verify(&self, token: &str) -> Result<User, JupyterHubError> {
        if token.is_empty() {
            return Err(JupyterHubRefusal::UnknownToken.into());
        }
        if let Some(user) = self.verified.lock().unwrap_or_else(PoisonError::into_inner).get(token) {
            return Ok(user);
        }
        if let Some(refusal) = self.refused.lock().unwrap_or_else(PoisonError::into_inner).get(token) {
            return Err(refusal.into());
        }
        // Not waiting for a permit: a flood would only queue up behind the Hub's timeouts.
        let Ok(permit) = Arc::clone(&self.lookups).try_acquire_owned() else {
            // Debug, not warn: whoever floods the daemon would flood its log too.
            tracing::debug!(hub = %self.api_url, "JupyterHub lookups all busy: a new token is unavailable");
            return Err(JupyterHubError::Unavailable(format!(
                "{HUB_LOOKUPS} tokens are being checked with JupyterHub already; retry shortly"
            )));
        };
        let asked = {
            let (agent, api_url, service_token) =
                (self.agent.clone(), self.api_url.clone(), self.service_token.clone());
            let token = token.to_owned();
            tokio::task::spawn_blocking(move || {
                let answer = identify(&agent, &api_url, service_token.as_deref(), &token);
                drop(permit);
                answer
            })
            .await
            .unwrap_or_else(|e| Err(JupyterHubError::Unavailable(format!("asking the Hub failed: {e}"))))
        };
        match &asked {
            Ok(user) => {
                self.verified.lock().unwrap_or_else(PoisonError::into_inner).insert(
                    token,
                    user.clone(),
                    self.trust_for,
                );
            }
            Err(JupyterHubError::Refused(refusal)) => {
                self.refused.lock().unwrap_or_else(PoisonError::into_inner).insert(
                    token,
                    refusal.clone(),
                    REFUSAL_CACHE,
                );
            }
            Err(JupyterHubError::Unavailable(why)) => {
                tracing::warn!(hub = %self.api_url, error = %why, "JupyterHub could not verify a token");
            }
        }
        asked
    }
}

/// Asks the Hub who holds `token` and checks the answer (blocking).
fn identify(
    agent: &ureq::Agent,
    api_url: &str,
    service_token: Option<&str>,
    token: &str,
) -> Result<User, JupyterHubError> {
    let owner = get_model(agent, &format!("{api_url}/user"), token).map_err(|e| match e {
        HubAnswer::Refused => JupyterHubError::Refused(JupyterHubRefusal::UnknownToken),
        HubAnswer::Unavailable(why) => JupyterHubError::Unavailable(format!("GET /user: {why}")),
    })?;
    if owner.kind != "user" {
        return Err(JupyterHubRefusal::NotAUser { kind: owner.kind, name: owner.name }.into());
    }
    check_user_name(&owner.name).map_err(JupyterHubRefusal::UnsafeName)?;
    if !grants_own_server_access(&owner.scopes, &owner.name) {
        return Err(JupyterHubRefusal::NoServerAccess { name: owner.name }.into());
    }
    let groups = match owner.groups {
        Some(groups) => groups,
        None => groups_as_service(agent, api_url, service_token, &owner.name)?,
    };
    Ok(User { name: owner.name, groups })
}

/// `name`'s groups, asked with this service's own token (`GET /users/{name}`; the service
/// needs `read:users:groups`). `name` is a safe account name, so it needs no escaping.
fn groups_as_service(
    agent: &ureq::Agent,
    api_url: &str,
    service_token: Option<&str>,
    name: &str,
) -> Result<Vec<String>, JupyterHubError> {
    let unavailable = |why: String| JupyterHubError::Unavailable(format!("{name}'s groups: {why}"));
    let Some(service_token) = service_token else {
        return Err(unavailable(
            "the Hub did not list them and auth.jupyterhub_token_file is not set to ask it".to_owned(),
        ));
    };
    let model = get_model(agent, &format!("{api_url}/users/{name}"), service_token).map_err(|e| match e {
        HubAnswer::Refused => {
            unavailable("the Hub refused the service's token (it needs read:users:groups)".to_owned())
        }
        HubAnswer::Unavailable(why) => unavailable(format!("GET /users/{name}: {why}")),
    })?;
    model
        .groups
        .ok_or_else(|| unavailable("the Hub did not list them to the service (it needs read:users:groups)".into()))
}

/// How a Hub request failed.
enum HubAnswer {
    /// 401, 403 or 404: the token is not good for this.
    Refused,
    /// No answer, another status, or not a model.
    Unavailable(String),
}

/// `GET url` with `token`, read as a user or service model.
fn get_model(agent: &ureq::Agent, url: &str, token: &str) -> Result<HubModel, HubAnswer> {
    let response = match agent.get(url).set("Authorization", &format!("token {token}")).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(401 | 403 | 404, _)) => return Err(HubAnswer::Refused),
        Err(ureq::Error::Status(code, _)) => return Err(HubAnswer::Unavailable(format!("the Hub answered {code}"))),
        Err(ureq::Error::Transport(e)) => return Err(HubAnswer::Unavailable(e.to_string())),
    };
    let mut body = Vec::new();
    response
        .into_reader()
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut body)
        .map_err(|e| HubAnswer::Unavailable(format!("reading the Hub's answer: {e}")))?;
    serde_json::from_slice(&body)
        .map_err(|e| HubAnswer::Unavailable(format!("the Hub's answer is not a user model: {e}")))
}

/// Whether `scopes` (the Hub's expanded list) grant access to `name`'s own servers.
fn grants_own_server_access(scopes: &[String], name: &str) -> bool {
    let of_user = format!("access:servers!user={name}");
    let of_server = format!("access:servers!server={name}/");
    scopes.iter().any(|s| s == "access:servers" || *s == of_user || s.starts_with(&of_server))
}

/// The service's token from `path`: the first line, which only the daemon's account may read.
fn read_service_token(path: &Path) -> Result<String, JupyterHubSetupError> {
    let read_error = |source| JupyterHubSetupError::ReadTokenFile { path: path.to_owned(), source };
    let mode = std::fs::metadata(path).map_err(read_error)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(JupyterHubSetupError::TokenFileExposed { path: path.to_owned(), mode: mode & 0o7777 });
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(JupyterHubSetupError::EmptyTokenFile { path: path.to_owned() });
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::extract::{Path as UrlPath, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    use axum::{Json, Router};
    use serde_json::{json, Value};

    use super::*;

    const SERVICE_TOKEN: &str = "service-token";

    /// A fake Hub: `GET /user` answers the model of each known token's owner, `GET /users/{name}`
    /// the full model to the service's token; `/broken/…` answers 500. It counts requests, and
    /// the most `GET /user` under way at once (each takes `delay` at least).
    #[derive(Default)]
    struct FakeHub {
        owners: HashMap<&'static str, Value>,
        full_models: HashMap<&'static str, Value>,
        whoami_calls: AtomicUsize,
        user_calls: AtomicUsize,
        delay: Duration,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    fn presented_token(headers: &HeaderMap) -> String {
        let value = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        value.strip_prefix("token ").unwrap_or("").to_owned()
    }

    async fn whoami(State(hub): State<Arc<FakeHub>>, headers: HeaderMap) -> Result<Json<Value>, StatusCode> {
        hub.whoami_calls.fetch_add(1, Ordering::SeqCst);
        let now = hub.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        hub.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(hub.delay).await;
        hub.in_flight.fetch_sub(1, Ordering::SeqCst);
        hub.owners.get(presented_token(&headers).as_str()).cloned().map(Json).ok_or(StatusCode::FORBIDDEN)
    }

    async fn user_model(
        State(hub): State<Arc<FakeHub>>,
        UrlPath(name): UrlPath<String>,
        headers: HeaderMap,
    ) -> Result<Json<Value>, StatusCode> {
        hub.user_calls.fetch_add(1, Ordering::SeqCst);
        if presented_token(&headers) != SERVICE_TOKEN {
            return Err(StatusCode::FORBIDDEN);
        }
        hub.full_models.get(name.as_str()).cloned().map(Json).ok_or(StatusCode::NOT_FOUND)
    }

    fn fake_hub() -> FakeHub {
        let owners = HashMap::from([
            (
                "alice-token",
                json!({"kind": "user", "name": "alice", "admin": false, "groups": ["ml", "staff"],
                       "scopes": ["access:servers!server=alice/", "users:activity!user=alice"],
                       "session_id": null, "token_id": "a7"}),
            ),
            (
                "carol-token",
                json!({"kind": "user", "name": "carol", "admin": false, "scopes": ["access:servers!user=carol"]}),
            ),
            (
                "dana-token",
                json!({"kind": "user", "name": "dana", "groups": [], "scopes": ["read:users:activity!user=dana"]}),
            ),
            (
                "eve-token",
                json!({"kind": "user", "name": "Eve@example.com", "groups": [], "scopes": ["access:servers"]}),
            ),
            (
                "service-token",
                json!({"kind": "service", "name": "notebookos", "scopes": ["read:users:groups", "access:servers"]}),
            ),
        ]);
        let full_models =
            HashMap::from([("carol", json!({"kind": "user", "name": "carol", "admin": false, "groups": ["physics"]}))]);
        FakeHub { owners, full_models, ..FakeHub::default() }
    }

    /// Serves `hub` on 127.0.0.1; the Hub's API URL.
    async fn serve(hub: Arc<FakeHub>) -> String {
        let router = Router::new()
            .route("/hub/api/user", get(whoami))
            .route("/hub/api/users/{name}", get(user_model))
            .route("/broken/user", get(|| async { StatusCode::BAD_GATEWAY }))
            .with_state(hub);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}/hub/api")
    }

    fn verifier(api_url: &str) -> JupyterHubVerifier {
        JupyterHubVerifier::new(api_url, Some(SERVICE_TOKEN.to_owned()), Duration::from_secs(3600)).unwrap()
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User { name: name.to_owned(), groups: groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    fn refusal(result: Result<User, JupyterHubError>) -> JupyterHubRefusal {
        match result {
            Err(JupyterHubError::Refused(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_users_token_gives_the_user_and_their_groups() {
        let hub = Arc::new(fake_hub());
        let verifier = verifier(&serve(hub.clone()).await);
        assert_eq!(verifier.verify("alice-token").await.unwrap(), user("alice", &["ml", "staff"]));
        assert_eq!(hub.user_calls.load(Ordering::SeqCst), 0, "the groups came with GET /user");
    }

    #[tokio::test]
    async fn a_verified_token_is_answered_from_the_cache() {
        let hub = Arc::new(fake_hub());
        let verifier = verifier(&serve(hub.clone()).await);
        verifier.verify("alice-token").await.unwrap();
        assert_eq!(verifier.verify("alice-token").await.unwrap(), user("alice", &["ml", "staff"]));
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), 1);
        let cache = verifier.verified.lock().unwrap();
        assert_eq!(cache.len(), 1);
        assert!(!cache.holds_in_clear("alice-token"), "the cache keys tokens by digest");
    }

    #[tokio::test]
    async fn groups_the_hub_omits_are_read_with_the_services_token() {
        let hub = Arc::new(fake_hub());
        let verifier = verifier(&serve(hub.clone()).await);
        assert_eq!(verifier.verify("carol-token").await.unwrap(), user("carol", &["physics"]));
        assert_eq!(hub.user_calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn groups_the_hub_omits_without_a_service_token_are_unavailable() {
        let hub = Arc::new(fake_hub());
        let url = serve(hub.clone()).await;
        let verifier = JupyterHubVerifier::new(&url, None, Duration::from_secs(3600)).unwrap();
        let error = verifier.verify("carol-token").await.unwrap_err();
        assert!(
            matches!(error, JupyterHubError::Unavailable(ref why) if why.contains("jupyterhub_token_file")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_unknown_token_is_refused_and_the_refusal_remembered() {
        let hub = Arc::new(fake_hub());
        let verifier = verifier(&serve(hub.clone()).await);
        assert_eq!(refusal(verifier.verify("forged").await), JupyterHubRefusal::UnknownToken);
        assert_eq!(refusal(verifier.verify("forged").await), JupyterHubRefusal::UnknownToken);
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), 1, "the second attempt did not reach the Hub");
        assert_eq!(refusal(verifier.verify("").await), JupyterHubRefusal::UnknownToken);
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), 1, "an empty token is not worth asking about");
    }

    #[tokio::test]
    async fn a_services_token_is_refused() {
        let verifier = verifier(&serve(Arc::new(fake_hub())).await);
        let refused = refusal(verifier.verify(SERVICE_TOKEN).await);
        assert_eq!(refused, JupyterHubRefusal::NotAUser { kind: "service".into(), name: "notebookos".into() });
    }

    #[tokio::test]
    async fn a_hub_name_unsafe_as_an_account_is_refused() {
        let verifier = verifier(&serve(Arc::new(fake_hub())).await);
        assert_eq!(
            refusal(verifier.verify("eve-token").await),
            JupyterHubRefusal::UnsafeName(UserNameError::NotAnAccountName { name: "Eve@example.com".into() })
        );
    }

    #[tokio::test]
    async fn a_hub_user_named_like_the_daemons_own_callers_is_refused() {
        let mut hub = fake_hub();
        let names = ["node-1", "operator", "anonymous", "unknown", "other"];
        let tokens = ["t-node", "t-operator", "t-anonymous", "t-unknown", "t-other"];
        for (token, name) in tokens.into_iter().zip(names) {
            hub.owners.insert(token, json!({"kind": "user", "name": name, "groups": [], "scopes": ["access:servers"]}));
        }
        let verifier = verifier(&serve(Arc::new(hub)).await);
        for (token, name) in tokens.into_iter().zip(names) {
            let refused = refusal(verifier.verify(token).await);
            assert_eq!(refused, JupyterHubRefusal::UnsafeName(UserNameError::Reserved { name: name.into() }));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_new_tokens_asks_the_hub_a_bounded_number_at_once() {
        let hub = Arc::new(FakeHub { delay: Duration::from_secs(2), ..fake_hub() });
        let verifier = Arc::new(verifier(&serve(hub.clone()).await));
        let excess = 8;
        let asks: Vec<_> = (0..HUB_LOOKUPS + excess)
            .map(|i| {
                let verifier = Arc::clone(&verifier);
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let answer = verifier.verify(&format!("forged-{i}")).await;
                    (answer, started.elapsed())
                })
            })
            .collect();
        let mut unavailable = 0;
        for ask in asks {
            let (answer, took) = ask.await.unwrap();
            match answer {
                Err(JupyterHubError::Unavailable(why)) => {
                    unavailable += 1;
                    assert!(took < Duration::from_secs(1), "answered at once, not after the Hub: {took:?}");
                    assert!(why.contains("retry"), "{why}");
                }
                other => assert_eq!(refusal(other), JupyterHubRefusal::UnknownToken),
            }
        }
        assert_eq!(unavailable, excess, "the tokens past the bound are unavailable");
        assert!(hub.most_in_flight.load(Ordering::SeqCst) <= HUB_LOOKUPS, "the Hub saw at most the bound at once");
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), HUB_LOOKUPS);
        assert!(verifier.verified.lock().unwrap().is_empty(), "a busy answer is not cached");
        assert_eq!(verifier.refused.lock().unwrap().len(), HUB_LOOKUPS);

        // The permits come back: the next token is asked about.
        assert_eq!(verifier.verify("alice-token").await.unwrap(), user("alice", &["ml", "staff"]));
    }

    #[tokio::test]
    async fn refused_tokens_never_push_a_verified_user_out() {
        let hub = Arc::new(fake_hub());
        let verifier = verifier(&serve(hub.clone()).await);
        verifier.verify("alice-token").await.unwrap();
        let flood = REFUSAL_CACHE_CAPACITY + 16;
        for i in 0..flood {
            assert_eq!(refusal(verifier.verify(&format!("forged-{i}")).await), JupyterHubRefusal::UnknownToken);
        }
        // At most: on a slow machine the first refusals may have expired (and been dropped) already.
        assert!(verifier.refused.lock().unwrap().len() <= REFUSAL_CACHE_CAPACITY, "the refusals are bounded");
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), 1 + flood);
        assert_eq!(verifier.verify("alice-token").await.unwrap(), user("alice", &["ml", "staff"]));
        assert_eq!(hub.whoami_calls.load(Ordering::SeqCst), 1 + flood, "alice's answer came from the cache");
    }

    #[tokio::test]
    async fn a_token_without_access_to_its_owners_servers_is_refused() {
        let verifier = verifier(&serve(Arc::new(fake_hub())).await);
        assert_eq!(
            refusal(verifier.verify("dana-token").await),
            JupyterHubRefusal::NoServerAccess { name: "dana".into() }
        );
    }

    #[tokio::test]
    async fn a_hub_that_is_down_is_unavailable_and_not_remembered() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hub/api", closed.local_addr().unwrap());
        drop(closed);
        let verifier = verifier(&url);
        let error = verifier.verify("alice-token").await.unwrap_err();
        assert!(matches!(error, JupyterHubError::Unavailable(_)), "{error}");
        assert_eq!(error.reason(), "hub_unavailable");
        assert!(verifier.verified.lock().unwrap().is_empty());
        assert!(verifier.refused.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_hub_answering_5xx_is_unavailable_and_not_remembered() {
        let hub = Arc::new(fake_hub());
        let url = serve(hub).await.replace("/hub/api", "/broken");
        let verifier = verifier(&url);
        let error = verifier.verify("alice-token").await.unwrap_err();
        assert!(matches!(error, JupyterHubError::Unavailable(ref why) if why.contains("502")), "{error}");
        assert!(verifier.verified.lock().unwrap().is_empty());
        assert!(verifier.refused.lock().unwrap().is_empty());
    }

    #[test]
    fn the_service_token_file_must_be_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub-token");
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let auth = AuthConfig {
            jupyterhub_api_url: Some("http://hub:8081/hub/api".into()),
            jupyterhub_token_file: Some(path.clone()),
            ..AuthConfig::default()
        };
        let error = JupyterHubVerifier::from_config(&auth).unwrap_err();
        assert!(matches!(error, JupyterHubSetupError::TokenFileExposed { mode: 0o644, .. }), "{error}");
        assert!(error.to_string().contains("chmod 600"));

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let verifier = JupyterHubVerifier::from_config(&auth).unwrap().unwrap();
        assert_eq!(verifier.service_token.as_deref(), Some("s3cret"));
        assert!(!format!("{verifier:?}").contains("s3cret"), "the token stays out of Debug");

        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(JupyterHubVerifier::from_config(&auth), Err(JupyterHubSetupError::EmptyTokenFile { .. })));
    }

    #[test]
    fn the_hub_is_optional_and_its_url_must_be_http() {
        assert!(JupyterHubVerifier::from_config(&AuthConfig::default()).unwrap().is_none());
        let auth = AuthConfig { jupyterhub_api_url: Some("file:///etc/passwd".into()), ..AuthConfig::default() };
        assert!(matches!(JupyterHubVerifier::from_config(&auth), Err(JupyterHubSetupError::BadUrl { .. })));
    }
}
