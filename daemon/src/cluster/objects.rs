//! The large-object store of namespace sync: payloads over `sync_inline_max_bytes`
//! (arrays, tensors, big pickles) are written here under `objects/{sha256}` and only a
//! content-addressed pointer goes through a kernel's raft log.
//!
//! The backend is the `object_store` crate: a local directory by default (one host, or a
//! directory every host mounts), or any S3-compatible store by URL (`s3://bucket/prefix`,
//! credentials and endpoint from the usual `AWS_*` environment variables). Objects are
//! immutable and named by their content, so writing one twice is harmless, and every
//! read is checked against its name: a corrupt or truncated object is an error, never
//! state applied to a kernel.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
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

/// The large-object store of this host.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// For messages: the URL or the directory.
    name: String,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").field("store", &self.name).finish()
    }
}

impl Objects {
    /// Opens the store at `url` (`file:///dir`, `s3://bucket/prefix`), or the directory
    /// `default_dir` when no URL is configured (created if missing).
    pub fn open(url: Option<&str>, default_dir: &Path) -> Result<Self, ObjectError> {
        let bad = |url: &str, reason: String| ObjectError::BadUrl { url: url.to_owned(), reason };
        let Some(url) = url.filter(|u| !u.is_empty()) else { return Self::local(default_dir) };
        let parsed = url::Url::parse(url).map_err(|e| bad(url, e.to_string()))?;
        match parsed.scheme() {
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| bad(url, "not an absolute local path".into()))?;
                Self::local(&dir)
            }
            "s3" | "s3a" => {
                let store = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(url, e.to_string()))?;
                Ok(Self { store: Arc::new(store), name: url.to_owned() })
            }
            other => Err(bad(url, format!("unsupported scheme {other:?} (use file:// or s3://)"))),
        }
    }

    fn local(dir: &Path) -> Result<Self, ObjectError> {
        let name = dir.display().to_string();
        let bad = |reason: String| ObjectError::BadUrl { url: name.clone(), reason };
        std::fs::create_dir_all(dir).map_err(|e| bad(format!("creating the directory: {e}")))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?;
        Ok(Self { store: Arc::new(store), name })
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
    pub async fn put_hashed(&self, data: Bytes, sha256: &str) -> Result<(), ObjectError> {
        valid_name(sha256)?;
        let path = Self::path(sha256);
        match self.store.head(&path).await {
            Ok(meta) if meta.size == data.len() as u64 => return Ok(()),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.backend(e)),
        }
        self.store.put(&path, data.into()).await.map_err(|e| self.backend(e))?;
        Ok(())
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
            return Err(ObjectError::Corrupt { sha256: sha256.to_owned(), store: self.name.clone(), actual });
        }
        Ok(data)
    }

    /// Whether object `sha256` is present.
    pub async fn contains(&self, sha256: &str) -> Result<bool, ObjectError> {
        valid_name(sha256)?;
        match self.store.head(&Self::path(sha256)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.backend(e)),
        }
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
}
