//! The store itself ([`Objects`]): put, get, list and delete content-addressed objects
//! under `{prefix}/objects/{sha256}`, on a local directory or an S3-compatible store.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::AmazonS3ConfigKey;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectMeta, ObjectStore, RetryConfig};
use sha2::{Digest, Sha256};

/// Why an object could not be stored or read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The configured URL is not a store we can open.
    #[error("large-object store URL {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A sha256 that is not 64 lowercase hex digits (a corrupt pointer).
    #[error("invalid object name {0:?} (expected a sha256 in hex)")]
    BadName(String),
    /// The object is not in the store (not written yet, or another host's local directory).
    #[error("object {sha256} is not in the large-object store {store}")]
    NotFound {
        /// Its name.
        sha256: String,
        /// The store (URL or directory).
        store: String,
    },
    /// The bytes read do not hash to the object's name.
    #[error("object {sha256} in {store} is corrupt: its content hashes to {actual}")]
    Corrupt {
        /// Its name.
        sha256: String,
        /// The store.
        store: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// A directory that should be the daemon's alone is not (owner, type).
    #[error("large-object store directory {dir}: {reason}")]
    NotPrivate {
        /// The directory.
        dir: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The backend failed.
    #[error("large-object store {store}: {source}")]
    Backend {
        /// The store.
        store: String,
        /// The failure.
        #[source]
        source: object_store::Error,
    },
}

/// Hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn valid_name(sha256: &str) -> Result<(), ObjectError> {
    if sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(ObjectError::BadName(sha256.to_owned()))
    }
}

/// `notebookos_refused_total` reasons of the object store.
const OBJECT_CORRUPT: &str = "object_corrupt";
const NOT_PRIVATE: &str = "object_store_not_private";

/// Makes `dir` a directory only the daemon's user can enter: created 0700 when missing;
/// when present, refused unless it is a real directory (not a symlink) owned by this
/// process's effective uid, and narrowed to 0700 if it was wider. A directory another
/// user made first (a predictable `/tmp` name) is refused, never used.
pub fn ensure_private_dir(dir: &Path) -> Result<(), ObjectError> {
    let refuse = |reason: String| {
        crate::metrics::count_refusal(NOT_PRIVATE);
        ObjectError::NotPrivate { dir: dir.to_owned(), reason }
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| refuse(format!("creating its parent: {e}")))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(format!("creating it: {e}"))),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| refuse(format!("reading it: {e}")))?;
    if !meta.file_type().is_dir() {
        return Err(refuse("is not a directory (a symlink, or a file); remove it or choose another store".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(format!(
            "is owned by uid {}, not by this daemon's uid {me}: another user could read or replace objects; remove it or choose another store",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        tracing::info!(dir = %dir.display(), mode = format!("{:o}", meta.mode() & 0o777), "narrowing the large-object store directory to 0700");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(format!("narrowing it to 0700: {e}")))?;
    }
    Ok(())
}

/// Limits of the calls to an S3 store: a stalled or failing server fails the cell's sync
/// within about `request_timeout × (max_retries + 1)`, not object_store's 3-minute default.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// One request, connection to last byte (`cluster.object_store_timeout`).
    pub request_timeout: Duration,
    /// Establishing a connection.
    pub connect_timeout: Duration,
    /// Retries of a failed request (with backoff).
    pub max_retries: usize,
    /// Further `AmazonS3ConfigKey` settings (name, value): the endpoint of a test server.
    pub extra: Vec<(String, String)>,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            max_retries: 2,
            extra: Vec::new(),
        }
    }
}

/// One object as listed: its name, size and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The sha256 it is named by.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
    /// Last written (a rewrite of the same content renews it).
    pub modified: SystemTime,
}

/// The large-object store of this host.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// For messages: the URL or the directory.
    name: String,
    /// A local store's directory (its files are made 0600).
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").field("store", &self.name).finish()
    }
}

impl Objects {
    /// Opens the store at `url` (`file:///dir`, `s3://bucket/prefix`), or the directory
    /// `default_dir` when no URL is configured (created if missing). S3 settings other than
    /// the URL's come from the `AWS_*` environment variables.
    pub fn open(url: Option<&str>, default_dir: &Path) -> Result<Self, ObjectError> {
        Self::open_with(url, default_dir, &S3Options::default())
    }

    /// [`Objects::open`] with S3 request limits and settings (`extra`: object_store's
    /// `AmazonS3ConfigKey` names and values, e.g. an endpoint) on top of the environment's.
    pub fn open_with(url: Option<&str>, default_dir: &Path, s3: &S3Options) -> Result<Self, ObjectError> {
        let bad = |url: &str, reason: String| ObjectError::BadUrl { url: url.to_owned(), reason };
        let Some(url) = url.filter(|u| !u.is_empty()) else {
            ensure_private_dir(default_dir)?;
            return Self::local(default_dir);
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(url, e.to_string()))?;
        match parsed.scheme() {
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| bad(url, "not an absolute local path".into()))?;
                Self::local(&dir)
            }
            "s3" | "s3a" => {
                // Set key by key: `with_client_options` would replace what the environment
                // set (AWS_ALLOW_HTTP, proxies) with defaults.
                let client = |key| AmazonS3ConfigKey::Client(key);
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .with_config(
                        client(ClientConfigKey::Timeout),
                        humantime::format_duration(s3.request_timeout).to_string(),
                    )
                    .with_config(
                        client(ClientConfigKey::ConnectTimeout),
                        humantime::format_duration(s3.connect_timeout).to_string(),
                    )
                    .with_retry(RetryConfig {
                        max_retries: s3.max_retries,
                        retry_timeout: s3.request_timeout.saturating_mul(2),
                        ..RetryConfig::default()
                    });
                for (key, value) in &s3.extra {
                    let key = key.parse().map_err(|e: object_store::Error| bad(url, format!("option {key}: {e}")))?;
                    builder = builder.with_config(key, value);
                }
                let bucket = builder.build().map_err(|e| bad(url, e.to_string()))?;
                // `with_url` keeps only the bucket: the URL's path is the prefix every key
                // goes under, so clusters can share a bucket and a policy scoped to
                // `bucket/prefix/*` allows every call.
                let prefix = ObjectPath::parse(parsed.path()).map_err(|e| bad(url, format!("prefix: {e}")))?;
                let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
                    Arc::new(bucket)
                } else {
                    Arc::new(PrefixStore::new(bucket, prefix))
                };
                Ok(Self { store, name: url.to_owned(), dir: None })
            }
            other => Err(bad(url, format!("unsupported scheme {other:?} (use file:// or s3://)"))),
        }
    }

    /// A directory store. A configured one (`file://`, maybe a mount every host shares) is
    /// created 0700 when missing and otherwise kept as the operator set it up.
    fn local(dir: &Path) -> Result<Self, ObjectError> {
        let name = dir.display().to_string();
        let bad = |reason: String| ObjectError::BadUrl { url: name.clone(), reason };
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| bad(format!("creating the directory: {e}")))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(bad(format!("creating the directory: {e}"))),
        }
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?;
        Ok(Self { store: Arc::new(store), name, dir: Some(dir.to_owned()) })
    }

    /// Object files of a local store are 0600 (the store's writer reads them back; nobody else).
    fn make_private(&self, sha256: &str) -> Result<(), ObjectError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let file = dir.join("objects").join(sha256);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(|e| ObjectError::NotPrivate {
            dir: dir.clone(),
            reason: format!("making {} 0600: {e}", file.display()),
        })
    }

    fn path(sha256: &str) -> ObjectPath {
        ObjectPath::from(format!("objects/{sha256}"))
    }

    fn backend(&self, source: object_store::Error) -> ObjectError {
        ObjectError::Backend { store: self.name.clone(), source }
    }

    /// Stores `data`; returns its sha256. An object already present is not rewritten.
    pub async fn put(&self, data: Bytes) -> Result<String, ObjectError> {
        let sha256 = sha256_hex(&data);
        self.put_hashed(data, &sha256).await?;
        Ok(sha256)
    }

    /// Stores `data` whose sha256 the caller just computed (saves hashing it twice).
    ///
    /// Always written, even when an object of that name is present: the write renews its
    /// modification time, which the collector's grace period counts from (an old object a
    /// new cell refers to again is not collected under it), and it replaces a tampered
    /// object rather than trusting it (reading it back to check would cost as much).
    pub async fn put_hashed(&self, data: Bytes, sha256: &str) -> Result<(), ObjectError> {
        valid_name(sha256)?;
        self.store.put(&Self::path(sha256), data.into()).await.map_err(|e| self.backend(e))?;
        self.make_private(sha256)
    }

    /// Reads object `sha256`, checking its content against its name.
    pub async fn get(&self, sha256: &str) -> Result<Bytes, ObjectError> {
        valid_name(sha256)?;
        let got = match self.store.get(&Self::path(sha256)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(ObjectError::NotFound { sha256: sha256.to_owned(), store: self.name.clone() })
            }
            Err(e) => return Err(self.backend(e)),
        };
        let data = got.bytes().await.map_err(|e| self.backend(e))?;
        // Hashing a large object takes a while: off the async workers.
        let hashed = data.clone();
        let actual = tokio::task::spawn_blocking(move || sha256_hex(&hashed)).await.unwrap_or_default();
        if actual != sha256 {
            crate::metrics::count_refusal(OBJECT_CORRUPT);
            return Err(ObjectError::Corrupt { sha256: sha256.to_owned(), store: self.name.clone(), actual });
        }
        Ok(data)
    }

    /// Whether object `sha256` is present.
    pub async fn contains(&self, sha256: &str) -> Result<bool, ObjectError> {
        Ok(self.head(sha256).await?.is_some())
    }

    /// Object `sha256`'s size and modification time, `None` when it is absent.
    pub async fn head(&self, sha256: &str) -> Result<Option<StoredObject>, ObjectError> {
        valid_name(sha256)?;
        match self.store.head(&Self::path(sha256)).await {
            Ok(meta) => Ok(Self::stored(&meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// Every object in the store (under its prefix). Keys that are not objects (another
    /// tool's files under the prefix) are skipped.
    pub async fn list(&self) -> Result<Vec<StoredObject>, ObjectError> {
        let prefix = ObjectPath::from("objects");
        let mut listing = self.store.list(Some(&prefix));
        let mut out = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| self.backend(e))?;
            out.extend(Self::stored(&meta));
        }
        Ok(out)
    }

    /// Deletes object `sha256` (absent already is success).
    pub async fn delete(&self, sha256: &str) -> Result<(), ObjectError> {
        valid_name(sha256)?;
        match self.store.delete(&Self::path(sha256)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend(e)),
        }
    }

    /// The store's name for messages (its URL or directory).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn stored(meta: &ObjectMeta) -> Option<StoredObject> {
        let sha256 = meta.location.filename()?;
        valid_name(sha256).ok()?;
        let in_objects = meta.location.prefix_matches(&ObjectPath::from("objects"));
        in_objects.then(|| StoredObject {
            sha256: sha256.to_owned(),
            size: meta.size,
            modified: SystemTime::from(meta.last_modified),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn objects_round_trip_and_corruption_is_caught() {
        let dir = tempfile::tempdir().expect("tmp");
        let objects = Objects::open(None, dir.path()).expect("open");
        let data = Bytes::from(vec![7u8; 3 << 20]);
        let sha = objects.put(data.clone()).await.expect("put");
        assert_eq!(sha, sha256_hex(&data));
        assert_eq!(objects.put(data.clone()).await.expect("put again"), sha);
        assert!(objects.contains(&sha).await.expect("head"));
        assert_eq!(objects.get(&sha).await.expect("get"), data);

        // Same store by URL.
        let url = format!("file://{}", dir.path().display());
        let by_url = Objects::open(Some(&url), Path::new("/nonexistent")).expect("open by url");
        assert_eq!(by_url.get(&sha).await.expect("get by url").len(), data.len());

        // A flipped byte on disk is refused, not returned.
        let file = dir.path().join("objects").join(&sha);
        let mut bytes = std::fs::read(&file).expect("read");
        bytes[100] ^= 1;
        std::fs::write(&file, bytes).expect("write");
        assert!(matches!(objects.get(&sha).await, Err(ObjectError::Corrupt { .. })));

        let missing = sha256_hex(b"never stored");
        assert!(matches!(objects.get(&missing).await, Err(ObjectError::NotFound { .. })));
        assert!(matches!(objects.get("../../etc/passwd").await, Err(ObjectError::BadName(_))));
        assert!(matches!(Objects::open(Some("ftp://x/y"), dir.path()), Err(ObjectError::BadUrl { .. })));
        assert!(matches!(Objects::open(Some("not a url"), dir.path()), Err(ObjectError::BadUrl { .. })));
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("stat").mode() & 0o777
    }

    #[tokio::test]
    async fn a_tampered_object_is_refused_then_replaced_and_local_stores_are_private() {
        let state = tempfile::tempdir().expect("tmp");
        let dir = state.path().join("objects");
        let objects = Objects::open(None, &dir).expect("open");
        assert_eq!(mode(&dir), 0o700, "the default store directory is private");
        let data = Bytes::from(vec![3u8; 4096]);
        let sha = objects.put(data.clone()).await.expect("put");
        let file = dir.join("objects").join(&sha);
        assert_eq!(mode(&file), 0o600, "object files are private");

        // Same size, other content: a store that trusted the size would hand it out as `sha`.
        std::fs::write(&file, vec![4u8; 4096]).expect("tamper");
        let before = crate::metrics::refusal_count(OBJECT_CORRUPT);
        let err = objects.get(&sha).await.expect_err("tampered object refused");
        assert!(err.to_string().contains("is corrupt"), "{err}");
        assert!(crate::metrics::refusal_count(OBJECT_CORRUPT) > before, "the refusal is counted");
        // A writer of the same value never reuses what is there: it writes its own bytes.
        objects.put(data.clone()).await.expect("put again rewrites it");
        assert_eq!(objects.get(&sha).await.expect("repaired"), data);
        assert_eq!(mode(&file), 0o600);
        let listed = objects.list().await.expect("list");
        assert_eq!(listed.iter().map(|o| (o.sha256.as_str(), o.size)).collect::<Vec<_>>(), vec![(sha.as_str(), 4096)]);
        objects.delete(&sha).await.expect("delete");
        assert!(objects.head(&sha).await.expect("head").is_none());
        assert!(objects.list().await.expect("list").is_empty());
    }

    #[test]
    fn a_store_directory_that_is_not_the_daemons_alone_is_fixed_or_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let wide = tmp.path().join("wide");
        std::fs::create_dir(&wide).expect("mkdir");
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        ensure_private_dir(&wide).expect("ours, narrowed");
        assert_eq!(mode(&wide), 0o700);

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&wide, &link).expect("symlink");
        let before = crate::metrics::refusal_count(NOT_PRIVATE);
        let err = ensure_private_dir(&link).expect_err("a symlink is refused");
        assert!(err.to_string().contains("not a directory"), "{err}");
        assert!(crate::metrics::refusal_count(NOT_PRIVATE) > before);

        // Another user's directory (needs root to make one).
        if nix::unistd::geteuid().is_root() {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            let err = ensure_private_dir(&theirs).expect_err("another user's directory is refused");
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        } else {
            // CI runs as root and sets NBOS_REQUIRE_PRIVILEGED=1: there this case must run.
            assert!(
                std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "NBOS_REQUIRE_PRIVILEGED=1 but not root: cannot make another user's directory"
            );
            eprintln!("skipped the other-owner case: not root");
        }
    }
}
