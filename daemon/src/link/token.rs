//! The API token as Jupyter servers take it: `Authorization: token T` (or `Bearer T`), or
//! `?token=T` (browsers cannot set headers on WebSockets); compared in constant time.
//! Shared by the gateway's and the cluster API's checks, and by clients reading a token file.

use std::path::Path;

use anyhow::Context;
use axum::extract::Request;
use axum::http::header;
use subtle::ConstantTimeEq;

/// True when `presented` is `expected`, in time that does not depend on where they differ.
pub fn token_matches(presented: &str, expected: &str) -> bool {
    bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

/// The token a request carries, from its header or its query string.
pub fn presented_token(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        for scheme in ["token ", "Token ", "Bearer ", "bearer "] {
            if let Some(t) = v.strip_prefix(scheme) {
                return Some(t.trim().to_owned());
            }
        }
    }
    req.uri().query().and_then(|q| {
        q.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == "token").map(|(_, v)| percent_decode(v))
    })
}

/// Reads the first line of a token file.
pub fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    anyhow::ensure!(!token.is_empty(), "token file {} is empty", path.display());
    Ok(token)
}

/// Minimal `%XX` decoding for a token in a query string.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1..i + 3)) {
            (b'%', Some(hex)) => match std::str::from_utf8(hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => {
                    out.push(b);
                    i += 3;
                }
                None => {
                    out.push(b'%');
                    i += 1;
                }
            },
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn req(uri: &str, auth: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().uri(uri);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(Body::empty()).expect("request")
    }

    #[test]
    fn token_from_header_or_query() {
        assert_eq!(presented_token(&req("/api", Some("token abc"))).as_deref(), Some("abc"));
        assert_eq!(presented_token(&req("/api", Some("Bearer abc"))).as_deref(), Some("abc"));
        assert_eq!(presented_token(&req("/api?x=1&token=a%2Bb", None)).as_deref(), Some("a+b"));
        assert_eq!(presented_token(&req("/api", Some("Basic Zm9v"))), None);
        assert_eq!(presented_token(&req("/api", None)), None);
    }
}
