//! [`OidcVerifier`]: an OIDC bearer JWT (`Authorization: Bearer …`) turned into a [`User`].
//!
//! `jsonwebtoken` checks the signature against the issuer's published keys (JWKS) and the
//! claims: `iss` is `auth.oidc_issuer`, `aud` names `auth.oidc_audience`, `exp` is required,
//! `exp` and `nbf` hold within [`LEEWAY`]. Only asymmetric algorithms are accepted, read from
//! the token's header before anything else, so `none` and HMAC (a token "signed" with the
//! issuer's public key as an HMAC secret) are refused before any key is looked at. A token
//! must name its key (`kid`); every issuer we know of does.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::account_name::{check_user_name, UserNameError};
use super::User;
use crate::config::AuthConfig;

/// How long one JWKS request may take, connection to last byte.
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// The least time between two JWKS requests: a flood of tokens naming unknown keys (or a
/// JWKS that is down) reaches the issuer once per this long.
pub const JWKS_MIN_REFETCH: Duration = Duration::from_secs(30);
/// How long fetched keys are used before they are fetched again, so a key the issuer
/// withdrew stops being trusted (if the JWKS is then unreachable, the old keys stay in use).
pub const JWKS_MAX_AGE: Duration = Duration::from_secs(600);
/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY: u64 = 30;
/// The largest JWKS read.
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// The signature algorithms accepted: asymmetric only.
const ALLOWED: [(&str, Algorithm); 6] = [
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("PS256", Algorithm::PS256),
];

/// The OIDC verifier could not be set up from `[auth]` (the daemon does not start).
#[derive(Debug, thiserror::Error)]
pub enum OidcSetupError {
    /// `auth.oidc_issuer` is set but a key it needs is not.
    #[error("auth.oidc_issuer is set, so auth.{key} must be too")]
    Missing {
        /// The missing key.
        key: &'static str,
    },
    /// `auth.oidc_jwks_url` is not an http(s) URL.
    #[error("auth.oidc_jwks_url {url:?} is not an http:// or https:// URL")]
    BadJwksUrl {
        /// The configured value.
        url: String,
    },
}

/// The token is refused: the request is unauthenticated (HTTP 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcRefusal {
    /// Not three base64url parts with a JSON header.
    #[error("not a JWT: {0}")]
    Malformed(String),
    /// The header's `alg` is not an accepted asymmetric algorithm (`none`, `HS256`, …).
    #[error("JWT algorithm {alg:?} is not accepted")]
    AlgorithmNotAllowed {
        /// The header's `alg`.
        alg: String,
    },
    /// The header names no key (`kid`).
    #[error("the JWT names no key (kid)")]
    MissingKeyId,
    /// The issuer publishes no key of that id, even after fetching its keys again.
    #[error("the issuer has no key {kid:?}")]
    UnknownKey {
        /// The header's `kid`.
        kid: String,
    },
    /// The key named is not for the header's algorithm.
    #[error("key {kid:?} is not a key for {alg}")]
    KeyAlgorithmMismatch {
        /// The header's `kid`.
        kid: String,
        /// The header's `alg`.
        alg: String,
    },
    /// The signature does not match (a forged or altered token).
    #[error("the JWT's signature is not valid")]
    BadSignature,
    /// `exp` has passed.
    #[error("the JWT has expired")]
    Expired,
    /// `nbf` has not come yet.
    #[error("the JWT is not valid yet (nbf)")]
    NotYetValid,
    /// `iss` is not `auth.oidc_issuer`.
    #[error("the JWT's issuer is not the configured one")]
    WrongIssuer,
    /// `aud` does not name `auth.oidc_audience`.
    #[error("the JWT is not meant for this audience")]
    WrongAudience,
    /// A required claim (`exp`, `iss`, `aud`, the user-name claim) is missing.
    #[error("the JWT has no {claim:?} claim")]
    MissingClaim {
        /// The claim.
        claim: String,
    },
    /// A claim is of the wrong type (a name that is not a string, groups not strings).
    #[error("the JWT's {claim:?} claim is not {expected}")]
    InvalidClaim {
        /// The claim.
        claim: String,
        /// What it should be.
        expected: &'static str,
    },
    /// The user-name claim cannot be a system account name.
    #[error("the JWT's user name is refused: {0}")]
    UnsafeName(UserNameError),
}

/// Why a bearer JWT gave no [`User`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum OidcError {
    /// The token is refused: HTTP 401.
    #[error(transparent)]
    Refused(#[from] OidcRefusal),
    /// The issuer's keys could not be fetched (down, 5xx, timeout, not a JWKS): HTTP 503.
    #[error("the OIDC issuer's keys are unavailable: {0}")]
    Unavailable(String),
}

impl OidcError {
    /// A short stable label (metrics, audit).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(refusal) => match refusal {
                OidcRefusal::Malformed(_) => "malformed",
                OidcRefusal::AlgorithmNotAllowed { .. } => "algorithm_not_allowed",
                OidcRefusal::MissingKeyId => "missing_kid",
                OidcRefusal::UnknownKey { .. } => "unknown_key",
                OidcRefusal::KeyAlgorithmMismatch { .. } => "key_algorithm_mismatch",
                OidcRefusal::BadSignature => "bad_signature",
                OidcRefusal::Expired => "expired",
                OidcRefusal::NotYetValid => "not_yet_valid",
                OidcRefusal::WrongIssuer => "wrong_issuer",
                OidcRefusal::WrongAudience => "wrong_audience",
                OidcRefusal::MissingClaim { .. } => "missing_claim",
                OidcRefusal::InvalidClaim { .. } => "invalid_claim",
                OidcRefusal::UnsafeName(_) => "unsafe_name",
            },
            Self::Unavailable(_) => "jwks_unavailable",
        }
    }
}

/// What an [`OidcVerifier`] checks (from `[auth]`, or built by a test).
#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// `iss` must be this.
    pub issuer: String,
    /// `aud` must name this.
    pub audience: String,
    /// The issuer's JWKS.
    pub jwks_url: String,
    /// The claim naming the user.
    pub username_claim: String,
    /// The claim listing the user's groups.
    pub groups_claim: String,
    /// The least time between two JWKS requests ([`JWKS_MIN_REFETCH`]).
    pub min_refetch: Duration,
}

impl OidcSettings {
    /// The settings `[auth]` gives: `None` without `oidc_issuer`.
    pub fn from_config(auth: &AuthConfig) -> Result<Option<Self>, OidcSetupError> {
        let Some(issuer) = &auth.oidc_issuer else { return Ok(None) };
        let audience = auth.oidc_audience.clone().ok_or(OidcSetupError::Missing { key: "oidc_audience" })?;
        let jwks_url = auth.oidc_jwks_url.clone().ok_or(OidcSetupError::Missing { key: "oidc_jwks_url" })?;
        Ok(Some(Self {
            issuer: issuer.clone(),
            audience,
            jwks_url,
            username_claim: auth.oidc_username_claim.clone(),
            groups_claim: auth.oidc_groups_claim.clone(),
            min_refetch: JWKS_MIN_REFETCH,
        }))
    }
}

/// Verifies bearer JWTs of one issuer, holding its keys.
pub struct OidcVerifier {
    settings: OidcSettings,
    agent: ureq::Agent,
    /// Held across a fetch, so that one request at a time goes to the issuer.
    keys: tokio::sync::Mutex<KeyCache>,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The issuer's keys as last fetched.
#[derive(Default)]
struct KeyCache {
    by_id: HashMap<String, Arc<SigningKey>>,
    /// When the keys were last fetched successfully.
    fetched: Option<Instant>,
    /// When they were last asked for, successfully or not.
    attempted: Option<Instant>,
    /// Why the last request failed, until one succeeds.
    last_error: Option<String>,
}

/// One of the issuer's public keys, with what it may verify.
struct SigningKey {
    key: DecodingKey,
    /// The JWK's `alg`, when it names one: the only algorithm it verifies.
    alg: Option<String>,
    /// An EC key's curve: ES256 needs P-256, ES384 P-384.
    curve: Option<EllipticCurve>,
}

/// The part of a JWT's header read before verification.
#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Extensions the token says must be understood: none are, so a token with any is refused.
    crit: Option<Value>,
}

impl OidcVerifier {
    /// The verifier `[auth]` configures: `None` without `oidc_issuer`. Fetches no keys yet:
    /// the first token does.
    pub fn from_config(auth: &AuthConfig) -> Result<Option<Self>, OidcSetupError> {
        OidcSettings::from_config(auth)?.map(Self::new).transpose()
    }

    /// A verifier with `settings`.
    pub fn new(settings: OidcSettings) -> Result<Self, OidcSetupError> {
        let is_http = url::Url::parse(&settings.jwks_url).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !is_http {
            return Err(OidcSetupError::BadJwksUrl { url: settings.jwks_url });
        }
        let agent = ureq::AgentBuilder::new().timeout(JWKS_TIMEOUT).build();
        Ok(Self { settings, agent, keys: tokio::sync::Mutex::new(KeyCache::default()) })
    }

    /// The user a bearer JWT names, once its signature and claims are verified.
    pub async fn verify(&self, token: &str) -> Result<User, OidcError> {
        let header = read_header(token)?;
        let Some(&(_, alg)) = ALLOWED.iter().find(|(name, _)| *name == header.alg) else {
            return Err(OidcRefusal::AlgorithmNotAllowed { alg: header.alg }.into());
        };
        if header.crit.is_some() {
            return Err(OidcRefusal::Malformed("the header lists critical extensions (crit)".into()).into());
        }
        let kid = header.kid.ok_or(OidcRefusal::MissingKeyId)?;
        let key = self.key(&kid).await?;
        if !key.verifies(&header.alg) {
            return Err(OidcRefusal::KeyAlgorithmMismatch { kid, alg: header.alg }.into());
        }
        let claims = self.verified_claims(token, &key.key, alg).map_err(|kind| match kind {
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => {
                OidcRefusal::KeyAlgorithmMismatch { kid, alg: header.alg }
            }
            other => refusal_of(other),
        })?;
        Ok(self.user_of(&claims)?)
    }

    /// The signature and the standard claims checked; the claims.
    fn verified_claims(
        &self,
        token: &str,
        key: &DecodingKey,
        alg: Algorithm,
    ) -> Result<Map<String, Value>, jsonwebtoken::errors::ErrorKind> {
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY;
        jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
            .map(|data| data.claims)
            .map_err(|e| e.into_kind())
    }

    /// The user the verified claims name.
    fn user_of(&self, claims: &Map<String, Value>) -> Result<User, OidcRefusal> {
        let name_claim = &self.settings.username_claim;
        let name = match claims.get(name_claim) {
            None | Some(Value::Null) => return Err(OidcRefusal::MissingClaim { claim: name_claim.clone() }),
            Some(Value::String(name)) => name.clone(),
            Some(_) => return Err(OidcRefusal::InvalidClaim { claim: name_claim.clone(), expected: "a string" }),
        };
        check_user_name(&name).map_err(OidcRefusal::UnsafeName)?;
        let groups_claim = &self.settings.groups_claim;
        let invalid_groups =
            || OidcRefusal::InvalidClaim { claim: groups_claim.clone(), expected: "a list of strings" };
        let groups = match claims.get(groups_claim) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(groups)) => groups
                .iter()
                .map(|g| g.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(invalid_groups)?,
            Some(_) => return Err(invalid_groups()),
        };
        Ok(User { name, groups })
    }

    /// The issuer's key `kid`, fetching the keys first when they are missing, old, or lack
    /// it (at most once per `min_refetch`).
    async fn key(&self, kid: &str) -> Result<Arc<SigningKey>, OidcError> {
        let mut cache = self.keys.lock().await;
        let stale = cache.fetched.is_none_or(|t| t.elapsed() >= JWKS_MAX_AGE);
        let may_fetch = cache.attempted.is_none_or(|t| t.elapsed() >= self.settings.min_refetch);
        if (stale || !cache.by_id.contains_key(kid)) && may_fetch {
            cache.attempted = Some(Instant::now());
            let (agent, url) = (self.agent.clone(), self.settings.jwks_url.clone());
            let fetched = tokio::task::spawn_blocking(move || fetch_keys(&agent, &url))
                .await
                .unwrap_or_else(|e| Err(format!("fetching failed: {e}")));
            match fetched {
                Ok(by_id) => {
                    tracing::debug!(jwks = %self.settings.jwks_url, keys = by_id.len(), "fetched the OIDC issuer's keys");
                    *cache = KeyCache { by_id, fetched: cache.attempted, attempted: cache.attempted, last_error: None };
                }
                Err(why) => {
                    tracing::warn!(jwks = %self.settings.jwks_url, error = %why, "fetching the OIDC issuer's keys failed");
                    cache.last_error = Some(why);
                }
            }
        }
        match (cache.by_id.get(kid), &cache.last_error) {
            (Some(key), _) => Ok(key.clone()),
            (None, Some(why)) => Err(OidcError::Unavailable(why.clone())),
            (None, None) => Err(OidcRefusal::UnknownKey { kid: kid.to_owned() }.into()),
        }
    }
}

impl SigningKey {
    /// Whether this key may verify a signature made with `alg` (an allowed algorithm).
    fn verifies(&self, alg: &str) -> bool {
        let alg_fits = self.alg.as_deref().is_none_or(|own| own == alg);
        let curve_fits = match (&self.curve, alg) {
            (None, _) => true,
            (Some(EllipticCurve::P256), "ES256") | (Some(EllipticCurve::P384), "ES384") => true,
            (Some(_), _) => false,
        };
        alg_fits && curve_fits
    }
}

/// The token's header, decoded without trusting it yet.
fn read_header(token: &str) -> Result<Header, OidcRefusal> {
    let malformed = |why: &str| OidcRefusal::Malformed(why.to_owned());
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(malformed("not three dot-separated parts"));
    };
    let json = URL_SAFE_NO_PAD.decode(header).map_err(|_| malformed("the header is not base64url"))?;
    serde_json::from_slice(&json).map_err(|_| malformed("the header is not a JSON object with alg"))
}

/// What a `jsonwebtoken` error (other than the algorithm's) means to the caller.
fn refusal_of(kind: jsonwebtoken::errors::ErrorKind) -> OidcRefusal {
    use jsonwebtoken::errors::ErrorKind as Kind;
    match kind {
        Kind::InvalidSignature | Kind::InvalidEcdsaKey | Kind::Crypto(_) => OidcRefusal::BadSignature,
        Kind::ExpiredSignature => OidcRefusal::Expired,
        Kind::ImmatureSignature => OidcRefusal::NotYetValid,
        Kind::InvalidIssuer => OidcRefusal::WrongIssuer,
        Kind::InvalidAudience => OidcRefusal::WrongAudience,
        Kind::MissingRequiredClaim(claim) => OidcRefusal::MissingClaim { claim },
        other => OidcRefusal::Malformed(format!("{other:?}")),
    }
}

/// The issuer's signing keys by id (blocking). Keys for encryption, symmetric keys, keys
/// without an id and keys this crate cannot read are skipped; none left is an error.
fn fetch_keys(agent: &ureq::Agent, url: &str) -> Result<HashMap<String, Arc<SigningKey>>, String> {
    #[derive(Deserialize)]
    struct JwkSet {
        keys: Vec<Value>,
    }
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("the JWKS URL answered {code}"),
        ureq::Error::Transport(e) => e.to_string(),
    })?;
    let mut body = Vec::new();
    response.into_reader().take(MAX_JWKS_BYTES).read_to_end(&mut body).map_err(|e| format!("reading the JWKS: {e}"))?;
    let set: JwkSet = serde_json::from_slice(&body).map_err(|e| format!("not a JWKS: {e}"))?;
    let by_id: HashMap<_, _> = set.keys.into_iter().filter_map(signing_key).collect();
    if by_id.is_empty() {
        return Err("the JWKS holds no usable signing key (RSA or EC with a kid)".into());
    }
    Ok(by_id)
}

/// One JWKS entry as a signing key, if it is one we can use.
fn signing_key(entry: Value) -> Option<(String, Arc<SigningKey>)> {
    let jwk: Jwk = serde_json::from_value(entry).ok()?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let curve = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => None,
        AlgorithmParameters::EllipticCurve(ec) => Some(ec.curve.clone()),
        // Symmetric (oct) keys never verify here; EdDSA is not in ALLOWED.
        AlgorithmParameters::OctetKey(_) | AlgorithmParameters::OctetKeyPair(_) => return None,
    };
    let kid = jwk.common.key_id.clone()?;
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    let alg = jwk.common.key_algorithm.map(|a| a.to_string());
    Some((kid, Arc::new(SigningKey { key, alg, curve })))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use axum::extract::State;
    use axum::routing::get;
    use axum::{Json, Router};
    use jsonwebtoken::{EncodingKey, Header as JwtHeader};
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://login.example.com/realms/lab";
    const AUDIENCE: &str = "notebookos";

    /// An issuer's key pair, made here (ECDSA P-256).
    struct TestKey {
        kid: String,
        pair: rcgen::KeyPair,
    }

    impl TestKey {
        fn new(kid: &str) -> Self {
            Self { kid: kid.to_owned(), pair: rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap() }
        }

        /// The public key as the issuer's JWKS lists it.
        fn jwk(&self) -> Value {
            let point = self.pair.public_key_raw(); // 0x04 ‖ x ‖ y
            json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
                   "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])})
        }

        fn sign(&self, claims: &Value) -> String {
            let mut header = JwtHeader::new(Algorithm::ES256);
            header.kid = Some(self.kid.clone());
            jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&self.pair.serialize_der())).unwrap()
        }
    }

    /// A fake issuer serving its JWKS at `/jwks` and counting the requests.
    #[derive(Default)]
    struct FakeIssuer {
        keys: Mutex<Vec<Value>>,
        fetches: AtomicUsize,
    }

    async fn jwks(State(issuer): State<Arc<FakeIssuer>>) -> Json<Value> {
        issuer.fetches.fetch_add(1, Ordering::SeqCst);
        Json(json!({"keys": issuer.keys.lock().unwrap().clone()}))
    }

    /// Serves `issuer`; its JWKS URL.
    async fn serve(issuer: Arc<FakeIssuer>) -> String {
        let router = Router::new()
            .route("/jwks", get(jwks))
            .route("/broken", get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }))
            .with_state(issuer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}/jwks")
    }

    fn settings(jwks_url: &str, min_refetch: Duration) -> OidcSettings {
        OidcSettings {
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            jwks_url: jwks_url.into(),
            username_claim: "preferred_username".into(),
            groups_claim: "groups".into(),
            min_refetch,
        }
    }

    /// An issuer publishing `k1` (and, to be skipped, an encryption key and a symmetric key),
    /// its verifier, and `k1`.
    async fn issuer_with_key(min_refetch: Duration) -> (Arc<FakeIssuer>, OidcVerifier, TestKey) {
        let key = TestKey::new("k1");
        let mut encryption_key = TestKey::new("enc1").jwk();
        encryption_key["use"] = json!("enc");
        let symmetric = json!({"kty": "oct", "kid": "shared", "k": URL_SAFE_NO_PAD.encode(b"shared-secret")});
        let issuer =
            Arc::new(FakeIssuer { keys: Mutex::new(vec![key.jwk(), encryption_key, symmetric]), ..Default::default() });
        let verifier = OidcVerifier::new(settings(&serve(issuer.clone()).await, min_refetch)).unwrap();
        (issuer, verifier, key)
    }

    fn claims(name: &str) -> Value {
        let now = jsonwebtoken::get_current_timestamp();
        json!({"iss": ISSUER, "aud": [AUDIENCE, "account"], "exp": now + 600, "iat": now, "nbf": now,
               "preferred_username": name, "groups": ["ml", "staff"]})
    }

    fn refusal(result: Result<User, OidcError>) -> OidcRefusal {
        match result {
            Err(OidcError::Refused(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A token with `header`, `claims` and `signature` as given (no signing).
    fn hand_made(header: &Value, claims: &Value, signature: &[u8]) -> String {
        let part = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        format!("{}.{}.{}", part(header), part(claims), URL_SAFE_NO_PAD.encode(signature))
    }

    #[tokio::test]
    async fn a_valid_token_gives_the_user_and_their_groups() {
        let (issuer, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let user = verifier.verify(&key.sign(&claims("alice"))).await.unwrap();
        assert_eq!(user, User { name: "alice".into(), groups: vec!["ml".into(), "staff".into()] });
        verifier.verify(&key.sign(&claims("bob"))).await.unwrap();
        assert_eq!(issuer.fetches.load(Ordering::SeqCst), 1, "the keys are fetched once");
    }

    #[tokio::test]
    async fn a_token_without_groups_gives_a_user_in_none() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let mut claims = claims("alice");
        claims.as_object_mut().unwrap().remove("groups");
        assert_eq!(verifier.verify(&key.sign(&claims)).await.unwrap().groups, Vec::<String>::new());
        let mut claims = self::claims("alice");
        claims["groups"] = json!("ml");
        let refused = refusal(verifier.verify(&key.sign(&claims)).await);
        assert!(matches!(refused, OidcRefusal::InvalidClaim { ref claim, .. } if claim == "groups"), "{refused}");
    }

    #[tokio::test]
    async fn an_expired_token_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let mut claims = claims("alice");
        claims["exp"] = json!(jsonwebtoken::get_current_timestamp() - 3600);
        assert_eq!(refusal(verifier.verify(&key.sign(&claims)).await), OidcRefusal::Expired);
        claims.as_object_mut().unwrap().remove("exp");
        assert_eq!(
            refusal(verifier.verify(&key.sign(&claims)).await),
            OidcRefusal::MissingClaim { claim: "exp".into() }
        );
    }

    #[tokio::test]
    async fn a_token_not_valid_yet_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let mut claims = claims("alice");
        claims["nbf"] = json!(jsonwebtoken::get_current_timestamp() + 3600);
        assert_eq!(refusal(verifier.verify(&key.sign(&claims)).await), OidcRefusal::NotYetValid);
    }

    #[tokio::test]
    async fn a_token_of_another_issuer_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let mut claims = claims("alice");
        claims["iss"] = json!("https://evil.example.com");
        assert_eq!(refusal(verifier.verify(&key.sign(&claims)).await), OidcRefusal::WrongIssuer);
    }

    #[tokio::test]
    async fn a_token_for_another_audience_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let mut claims = claims("alice");
        claims["aud"] = json!("grafana");
        assert_eq!(refusal(verifier.verify(&key.sign(&claims)).await), OidcRefusal::WrongAudience);
    }

    #[tokio::test]
    async fn a_tampered_token_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let signed = key.sign(&claims("alice"));
        let [header, _, signature] = signed.split('.').collect::<Vec<_>>()[..] else { panic!("not a JWT: {signed}") };
        let other_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims("root")).unwrap());
        let tampered = format!("{header}.{other_payload}.{signature}");
        assert_eq!(refusal(verifier.verify(&tampered).await), OidcRefusal::BadSignature);
    }

    #[tokio::test]
    async fn a_token_signed_by_another_key_under_a_known_kid_is_refused() {
        let (_, verifier, _) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let impostor = TestKey::new("k1");
        assert_eq!(refusal(verifier.verify(&impostor.sign(&claims("alice"))).await), OidcRefusal::BadSignature);
    }

    #[tokio::test]
    async fn an_unknown_key_is_refused_after_fetching_the_keys_again() {
        let (issuer, verifier, key) = issuer_with_key(Duration::ZERO).await;
        verifier.verify(&key.sign(&claims("alice"))).await.unwrap();
        let stranger = TestKey::new("k9");
        assert_eq!(
            refusal(verifier.verify(&stranger.sign(&claims("alice"))).await),
            OidcRefusal::UnknownKey { kid: "k9".into() }
        );
        assert_eq!(issuer.fetches.load(Ordering::SeqCst), 2, "the unknown kid made the verifier fetch the keys again");
    }

    #[tokio::test]
    async fn a_key_the_issuer_adds_is_found_by_fetching_again() {
        let (issuer, verifier, key) = issuer_with_key(Duration::ZERO).await;
        verifier.verify(&key.sign(&claims("alice"))).await.unwrap();
        let rotated = TestKey::new("k2");
        issuer.keys.lock().unwrap().push(rotated.jwk());
        assert_eq!(verifier.verify(&rotated.sign(&claims("alice"))).await.unwrap().name, "alice");
    }

    #[tokio::test]
    async fn unknown_keys_fetch_the_keys_at_most_once_per_interval() {
        let (issuer, verifier, key) = issuer_with_key(Duration::from_secs(3600)).await;
        verifier.verify(&key.sign(&claims("alice"))).await.unwrap();
        for kid in ["k7", "k8", "k9"] {
            let refused = refusal(verifier.verify(&TestKey::new(kid).sign(&claims("alice"))).await);
            assert_eq!(refused, OidcRefusal::UnknownKey { kid: kid.into() });
        }
        assert_eq!(issuer.fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_unsigned_token_is_refused() {
        let (_, verifier, _) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let unsigned = hand_made(&json!({"alg": "none", "typ": "JWT", "kid": "k1"}), &claims("alice"), b"");
        assert_eq!(refusal(verifier.verify(&unsigned).await), OidcRefusal::AlgorithmNotAllowed { alg: "none".into() });
    }

    #[tokio::test]
    async fn an_hmac_token_keyed_with_the_public_key_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        // The classic confusion: the issuer's public key, as published, used as an HMAC secret.
        let public_key = serde_json::to_vec(&key.jwk()).unwrap();
        for secret in [public_key.as_slice(), key.pair.public_key_raw(), b"shared-secret".as_slice()] {
            for kid in ["k1", "shared"] {
                let mut header = JwtHeader::new(Algorithm::HS256);
                header.kid = Some(kid.into());
                let forged =
                    jsonwebtoken::encode(&header, &claims("alice"), &EncodingKey::from_secret(secret)).unwrap();
                assert_eq!(
                    refusal(verifier.verify(&forged).await),
                    OidcRefusal::AlgorithmNotAllowed { alg: "HS256".into() }
                );
            }
        }
    }

    #[tokio::test]
    async fn a_key_used_with_another_algorithm_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let signed = key.sign(&claims("alice"));
        let [_, payload, signature] = signed.split('.').collect::<Vec<_>>()[..] else { panic!("not a JWT: {signed}") };
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","kid":"k1"}"#);
        let refused = refusal(verifier.verify(&format!("{header}.{payload}.{signature}")).await);
        assert_eq!(refused, OidcRefusal::KeyAlgorithmMismatch { kid: "k1".into(), alg: "RS256".into() });
    }

    #[tokio::test]
    async fn a_token_without_a_kid_or_with_critical_extensions_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let signed = key.sign(&claims("alice"));
        let [_, payload, signature] = signed.split('.').collect::<Vec<_>>()[..] else { panic!("not a JWT: {signed}") };
        let no_kid = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256"}"#);
        assert_eq!(
            refusal(verifier.verify(&format!("{no_kid}.{payload}.{signature}")).await),
            OidcRefusal::MissingKeyId
        );
        let crit = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","kid":"k1","crit":["exp"]}"#);
        let refused = refusal(verifier.verify(&format!("{crit}.{payload}.{signature}")).await);
        assert!(matches!(refused, OidcRefusal::Malformed(_)), "{refused}");
    }

    #[tokio::test]
    async fn what_is_not_a_jwt_is_refused() {
        let (issuer, verifier, _) = issuer_with_key(JWKS_MIN_REFETCH).await;
        for token in ["", "abc", "a.b", "a.b.c.d", "!!!.e30.x", "e30.e30.x"] {
            let refused = refusal(verifier.verify(token).await);
            assert!(matches!(refused, OidcRefusal::Malformed(_)), "{token:?}: {refused}");
        }
        assert_eq!(issuer.fetches.load(Ordering::SeqCst), 0, "no key is fetched for a token that is not a JWT");
    }

    #[tokio::test]
    async fn a_user_name_missing_or_unsafe_as_an_account_is_refused() {
        let (_, verifier, key) = issuer_with_key(JWKS_MIN_REFETCH).await;
        let refused = refusal(verifier.verify(&key.sign(&claims("alice@example.com"))).await);
        assert!(
            matches!(refused, OidcRefusal::UnsafeName(UserNameError::NotAnAccountName { ref name }) if name == "alice@example.com"),
            "{refused}"
        );
        for name in ["node-1", "operator", "anonymous", "unknown", "other"] {
            let refused = refusal(verifier.verify(&key.sign(&claims(name))).await);
            assert_eq!(refused, OidcRefusal::UnsafeName(UserNameError::Reserved { name: name.into() }));
        }
        let mut claims = claims("alice");
        claims.as_object_mut().unwrap().remove("preferred_username");
        let refused = refusal(verifier.verify(&key.sign(&claims)).await);
        assert_eq!(refused, OidcRefusal::MissingClaim { claim: "preferred_username".into() });
    }

    #[tokio::test]
    async fn keys_that_cannot_be_fetched_make_the_issuer_unavailable() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/jwks", closed.local_addr().unwrap());
        drop(closed);
        let verifier = OidcVerifier::new(settings(&url, JWKS_MIN_REFETCH)).unwrap();
        let error = verifier.verify(&TestKey::new("k1").sign(&claims("alice"))).await.unwrap_err();
        assert!(matches!(error, OidcError::Unavailable(_)), "{error}");
        assert_eq!(error.reason(), "jwks_unavailable");

        let issuer = Arc::new(FakeIssuer::default());
        let broken = serve(issuer).await.replace("/jwks", "/broken");
        let verifier = OidcVerifier::new(settings(&broken, JWKS_MIN_REFETCH)).unwrap();
        let error = verifier.verify(&TestKey::new("k1").sign(&claims("alice"))).await.unwrap_err();
        assert!(matches!(error, OidcError::Unavailable(ref why) if why.contains("500")), "{error}");
    }

    #[tokio::test]
    async fn keys_fetched_once_stay_in_use_while_the_issuer_is_down() {
        let (issuer, verifier, key) = issuer_with_key(Duration::ZERO).await;
        verifier.verify(&key.sign(&claims("alice"))).await.unwrap();
        issuer.keys.lock().unwrap().clear(); // the issuer now serves a JWKS with no usable key
        verifier.keys.lock().await.fetched = Some(Instant::now() - JWKS_MAX_AGE); // the keys are due for a refresh
        assert_eq!(verifier.verify(&key.sign(&claims("alice"))).await.unwrap().name, "alice");
        assert_eq!(issuer.fetches.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn oidc_is_optional_and_needs_an_audience_and_keys() {
        assert!(OidcVerifier::from_config(&AuthConfig::default()).unwrap().is_none());
        let mut auth = AuthConfig { oidc_issuer: Some(ISSUER.into()), ..AuthConfig::default() };
        assert!(matches!(OidcVerifier::from_config(&auth), Err(OidcSetupError::Missing { key: "oidc_audience" })));
        auth.oidc_audience = Some(AUDIENCE.into());
        assert!(matches!(OidcVerifier::from_config(&auth), Err(OidcSetupError::Missing { key: "oidc_jwks_url" })));
        auth.oidc_jwks_url = Some("ftp://login.example.com/keys".into());
        assert!(matches!(OidcVerifier::from_config(&auth), Err(OidcSetupError::BadJwksUrl { .. })));
        auth.oidc_jwks_url = Some("https://login.example.com/keys".into());
        assert!(OidcVerifier::from_config(&auth).unwrap().is_some());
    }
}
