//! `auth.users_file`: users and the SHA-256 of their tokens, in TOML:
//!
//! ```toml
//! [[user]]
//! name = "alice"
//! token_sha256 = "5e88…"   # sha256sum of the token, lowercase hex; never the token
//! groups = ["ml"]
//! kernels = 4              # optional: overrides [limits.user] key by key
//! ```
//!
//! Checked whole at load: a bad entry is a config error naming it, never a user skipped.
//! A presented token is hashed and compared with every entry's hash in constant time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::account_name::check_user_name;
use super::source::{AuthError, IdentitySource};
use super::User;
use crate::config::Quota;

/// Why a users file was refused.
#[derive(Debug, thiserror::Error)]
pub enum UsersFileError {
    /// Not readable.
    #[error("auth.users_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not TOML of the expected shape.
    #[error("auth.users_file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's words.
        message: String,
    },
    /// One entry is wrong.
    #[error("auth.users_file {path}: [[user]] number {index} ({name:?}): {why}")]
    Entry {
        /// The file.
        path: PathBuf,
        /// 1-based position of the entry.
        index: usize,
        /// Its name as written.
        name: String,
        /// What is wrong.
        why: String,
    },
}

/// One `[[user]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    token_sha256: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(flatten)]
    quota: Quota,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    user: Vec<RawEntry>,
}

/// One user of the file.
#[derive(Debug, Clone)]
pub struct UserEntry {
    /// The user.
    pub user: User,
    /// Their quota keys, which override `[limits.user]` key by key.
    pub quota: Quota,
    token_sha256: [u8; 32],
}

/// The users of `auth.users_file`.
#[derive(Debug, Clone, Default)]
pub struct UsersFile {
    entries: Vec<UserEntry>,
}

/// A group name: printable, no spaces or quotes (it appears in config keys and logs).
fn is_safe_group_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn parse_hash(hex_text: &str) -> Result<[u8; 32], String> {
    let mut out = [0u8; 32];
    if hex_text.len() != 64 || !hex_text.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
        return Err(format!(
            "token_sha256 must be 64 lowercase hex digits (sha256sum of the token), got {} characters",
            hex_text.len()
        ));
    }
    hex::decode_to_slice(hex_text, &mut out).map_err(|e| format!("token_sha256: {e}"))?;
    Ok(out)
}

impl UsersFile {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, UsersFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| UsersFileError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Checks the text of a users file (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, UsersFileError> {
        let raw: RawFile = toml::from_str(text)
            .map_err(|e| UsersFileError::Parse { path: path.to_owned(), message: e.to_string() })?;
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        let mut entries = Vec::with_capacity(raw.user.len());
        for (i, e) in raw.user.into_iter().enumerate() {
            let bad =
                |why: String| UsersFileError::Entry { path: path.to_owned(), index: i + 1, name: e.name.clone(), why };
            check_user_name(&e.name).map_err(|why| bad(why.to_string()))?;
            let hash = parse_hash(&e.token_sha256).map_err(bad)?;
            if let Some(g) = e.groups.iter().find(|g| !is_safe_group_name(g)) {
                return Err(bad(format!("group {g:?} is not a group name ([A-Za-z0-9_.-]+)")));
            }
            if !names.insert(e.name.clone()) {
                return Err(bad("a second entry with this name".into()));
            }
            if !hashes.insert(hash) {
                return Err(bad("the same token_sha256 as an earlier entry (two users with one token)".into()));
            }
            if e.quota.gpu_hours_per_day.is_some_and(|h| !(h.is_finite() && h >= 0.0)) {
                return Err(bad("gpu_hours_per_day must be a number of hours, 0 or more".into()));
            }
            entries.push(UserEntry {
                user: User { name: e.name, groups: e.groups },
                quota: e.quota,
                token_sha256: hash,
            });
        }
        Ok(Self { entries })
    }

    /// The entry whose token `presented` is: its SHA-256 compared with every entry's in
    /// constant time (no early exit, so timing says nothing of which entry or how close).
    pub fn find_by_token(&self, presented: &str) -> Option<&UserEntry> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.token_sha256.ct_eq(&hash)) {
                found = Some(e);
            }
        }
        found
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&UserEntry> {
        self.entries.iter().find(|e| e.user.name == name)
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No users.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The users file as a source: a token whose SHA-256 is an entry's.
#[async_trait]
impl IdentitySource for UsersFile {
    fn name(&self) -> &'static str {
        "users_file"
    }

    async fn identify(
        &self,
        token: Option<&str>,
        _cert: Option<&CertificateDer<'static>>,
    ) -> Result<Option<User>, AuthError> {
        Ok(token.and_then(|t| self.find_by_token(t)).map(|e| e.user.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/etc/notebookos/users.toml";

    fn sha(t: &str) -> String {
        hex::encode(Sha256::digest(t.as_bytes()))
    }

    fn parse(text: &str) -> Result<UsersFile, UsersFileError> {
        UsersFile::parse(text, Path::new(P))
    }

    #[test]
    fn users_are_found_by_their_token_and_never_by_its_hash() {
        let text = format!(
            "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\ngroups = [\"ml\"]\nkernels = 2\n\n\
             [[user]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
            sha("alice-token-0123456789"),
            sha("bob-token-0123456789")
        );
        let f = parse(&text).expect("valid file");
        assert_eq!(f.len(), 2);
        let alice = f.find_by_token("alice-token-0123456789").expect("alice's token");
        assert_eq!(alice.user, User { name: "alice".into(), groups: vec!["ml".into()] });
        assert_eq!(alice.quota.kernels, Some(2));
        assert_eq!(f.find_by_token("bob-token-0123456789").map(|e| e.user.name.as_str()), Some("bob"));
        assert!(f.find_by_token(&sha("alice-token-0123456789")).is_none(), "the hash is not the token");
        assert!(f.find_by_token("").is_none());
        assert!(f.find_by_token("alice-token-012345678").is_none());
    }

    #[test]
    fn bad_entries_are_config_errors_naming_the_entry() {
        let ok = sha("t1");
        let cases = [
            (format!("[[user]]\nname = \"Alice\"\ntoken_sha256 = \"{ok}\"\n"), "POSIX account name"),
            (format!("[[user]]\nname = \"../root\"\ntoken_sha256 = \"{ok}\"\n"), "POSIX account name"),
            (format!("[[user]]\nname = \"\"\ntoken_sha256 = \"{ok}\"\n"), "POSIX account name"),
            (format!("[[user]]\nname = \"node-1\"\ntoken_sha256 = \"{ok}\"\n"), "hosts"),
            ("[[user]]\nname = \"alice\"\ntoken_sha256 = \"abc\"\n".to_owned(), "64 lowercase hex"),
            (format!("[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n", ok.to_uppercase()), "64 lowercase hex"),
            (format!("[[user]]\nname = \"alice\"\ntoken_sha256 = \"{ok}\"\ngroups = [\"a b\"]\n"), "group"),
            (
                format!("[[user]]\nname = \"alice\"\ntoken_sha256 = \"{ok}\"\n[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n", sha("t2")),
                "second entry with this name",
            ),
            (
                format!("[[user]]\nname = \"alice\"\ntoken_sha256 = \"{ok}\"\n[[user]]\nname = \"bob\"\ntoken_sha256 = \"{ok}\"\n"),
                "same token_sha256",
            ),
        ];
        for (text, want) in cases {
            let err = parse(&text).expect_err(&text).to_string();
            assert!(err.contains(want), "{err} (wanted {want:?})");
            assert!(err.contains(P), "names the file: {err}");
            assert!(err.contains("[[user]] number"), "names the entry: {err}");
        }
        let unknown = parse(&format!("[[user]]\nname = \"alice\"\ntoken_sha256 = \"{ok}\"\ntoken = \"clear\"\n"));
        assert!(unknown.expect_err("unknown key").to_string().contains("token"));
        assert!(matches!(parse("user = 3"), Err(UsersFileError::Parse { .. })));
    }

    #[test]
    fn the_daemons_own_names_and_dotted_names() {
        let ok = sha("t1");
        for name in ["node-1", "operator", "anonymous", "unknown", "other"] {
            let err = parse(&format!("[[user]]\nname = \"{name}\"\ntoken_sha256 = \"{ok}\"\n")).expect_err(name);
            assert!(err.to_string().contains("not users"), "{err}");
        }
        let dotted = parse(&format!("[[user]]\nname = \"j.doe\"\ntoken_sha256 = \"{ok}\"\n")).expect("j.doe");
        assert!(dotted.get("j.doe").is_some(), "the rule every source shares allows `.`");
    }
}
