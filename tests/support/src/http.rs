//! The tests' HTTP requests to a daemon: status and body whatever the status.

use std::time::Duration;

/// One HTTP request; returns the status code and body whatever the status.
pub fn http(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    http_via(&ureq::agent(), method, url, token, body)
}

/// [`http`] through `agent` (e.g. one with TLS and a client certificate).
pub fn http_via(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut req = agent.request(method, url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("token {t}"));
    }
    let res = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// `method base+path` with `token` through `agent`; status and JSON body (`Null` if none,
/// status 0 and the error's text if the request did not reach the host).
pub fn request(
    agent: &ureq::Agent,
    method: &str,
    base: &str,
    path: &str,
    body: Option<serde_json::Value>,
    token: &str,
) -> (u16, serde_json::Value) {
    let send = || -> Result<ureq::Response, Box<ureq::Error>> {
        let req = agent
            .request(method, &format!("{base}{path}"))
            // A cluster create waits for its three replicas to start (the daemon's own
            // deadline is longer): 15 s timed out on a loaded 2-core CI machine.
            .timeout(Duration::from_secs(60))
            .set("Authorization", &format!("token {token}"));
        match &body {
            Some(b) => req.set("Content-Type", "application/json").send_string(&b.to_string()),
            None => req.call(),
        }
        .map_err(Box::new)
    };
    let res = match send() {
        // A pooled connection the server had closed after refusing the previous request
        // (hyper does not keep a connection whose request body it did not read): the request
        // never reached it, so once more (the agent dropped that connection: a new one).
        Err(e) if matches!(&*e, ureq::Error::Transport(t) if t.to_string().contains("Unexpected EOF")) => send(),
        other => other,
    }
    .map_err(|e| *e);
    let (code, text) = match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => return (0, serde_json::Value::String(e.to_string())),
    };
    (code, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}
