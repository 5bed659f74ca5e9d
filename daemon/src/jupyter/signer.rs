//! HMAC-SHA256 signatures of Jupyter messages (`signature_scheme = "hmac-sha256"`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Signs and verifies with one kernel's key. An empty key means "no signing", as
/// in jupyter_client: the signature is the empty string and is not checked.
#[derive(Clone)]
pub struct Signer {
    mac: Option<HmacSha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Signer").field("signing", &self.mac.is_some()).finish()
    }
}

impl Signer {
    /// A signer for `key` (the connection file's `key`, as bytes).
    pub fn new(key: &[u8]) -> Self {
        if key.is_empty() {
            return Self { mac: None };
        }
        // HMAC accepts keys of any length; the error case cannot happen for Hmac<Sha256>.
        Self { mac: HmacSha256::new_from_slice(key).ok() }
    }

    /// True when messages are signed.
    pub fn is_signing(&self) -> bool {
        self.mac.is_some()
    }

    /// Hex signature of the four JSON parts.
    pub fn sign(&self, parts: [&[u8]; 4]) -> String {
        match &self.mac {
            None => String::new(),
            Some(mac) => {
                let mut mac = mac.clone();
                for p in parts {
                    mac.update(p);
                }
                hex::encode(mac.finalize().into_bytes())
            }
        }
    }

    /// Checks a hex signature in constant time.
    pub fn verify(&self, signature: &[u8], parts: [&[u8]; 4]) -> bool {
        let Some(mac) = &self.mac else { return true };
        let Ok(expected) = hex::decode(signature) else { return false };
        let mut mac = mac.clone();
        for p in parts {
            mac.update(p);
        }
        mac.verify_slice(&expected).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_python_reference_signature() {
        // hmac.new(b"secret", b"abcd", hashlib.sha256).hexdigest()
        let s = Signer::new(b"secret");
        let sig = s.sign([b"a", b"b", b"c", b"d"]);
        assert_eq!(sig, "3057ecbaeceffb90b97394a97267236eca9f9e5520dfe387831a22a0eb7709d2");
        assert!(s.verify(sig.as_bytes(), [b"a", b"b", b"c", b"d"]));
        assert!(!s.verify(sig.as_bytes(), [b"a", b"b", b"c", b"e"]));
        assert!(!s.verify(b"zz", [b"a", b"b", b"c", b"d"]));
    }

    #[test]
    fn empty_key_does_not_sign() {
        let s = Signer::new(b"");
        assert!(!s.is_signing());
        assert_eq!(s.sign([b"a", b"b", b"c", b"d"]), "");
        assert!(s.verify(b"", [b"a", b"b", b"c", b"d"]));
    }
}
