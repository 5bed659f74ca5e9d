//! Attacks on the cluster's HTTP authentication, each next to the legitimate path, on a
//! cluster with a test PKI (raft mutual TLS, HTTPS with client certificates):
//!
//! - the users' token on a host-to-host route (`/internal/v1/replicas/…`, the legacy
//!   `?replica=local` form, a forwarded cluster call) -> 403;
//! - a node certificate claiming another node id -> 403;
//! - the users' token or a node certificate on an operator route (membership, creating a
//!   kernel record past the `[limits]` caps) -> 403, a node certificate on a membership call
//!   marked forwarded too (the forwarding host also sends the operator token);
//! - `add_member` of a node id that is already a member -> 409 with a clear message;
//! - the users' token, or a node certificate, on a canary register of the meta group -> 403;
//! - without node certificates (a loopback cluster with no PKI), the users' token on a
//!   host-to-host route -> 403: hosts then use the operator token.
//!
//! Every refusal is counted in `notebookos_http_auth_refusals_total{reason}`.

use std::time::Duration;

use nbos_test_support::{Options, TestCluster, OPERATOR_TOKEN, TOKEN};
use serde_json::json;

/// A kernel id no host has: a request that passes authentication gets 404.
const NO_KERNEL: &str = "0b6c4a83-2a36-4f7e-9d3c-6f2b7f0b9a11";

fn metric(c: &TestCluster, node: u64, reason: &str) -> f64 {
    let text =
        c.agent().get(&format!("{}/metrics", c.host(node).url)).call().expect("metrics").into_string().expect("text");
    let name = format!("notebookos_http_auth_refusals_total{{reason=\"{reason}\"}}");
    text.lines().find_map(|l| l.strip_prefix(&name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

/// Calls `method url` as host `as_node` (its node certificate), naming itself `claimed`.
fn as_node(c: &TestCluster, as_node: u64, claimed: u64, method: &str, url: &str, forwarded: bool) -> u16 {
    let pki = c.dir().join("pki");
    let config = notebookosd::link::tls::client_config(
        &pki.join("ca.pem"),
        Some((&pki.join(format!("node-{as_node}.pem")), &pki.join(format!("node-{as_node}.key")))),
    )
    .expect("node tls");
    let agent = ureq::AgentBuilder::new().tls_config(config).timeout(Duration::from_secs(30)).build();
    let mut req = agent.request(method, url).set(notebookosd::link::credential::NODE_HEADER, &claimed.to_string());
    if forwarded {
        req = req.set(notebookosd::cluster::control::meta::FORWARDED_HEADER, "1");
    }
    status(req.call())
}

fn with_token(c: &TestCluster, token: &str, method: &str, url: &str, body: Option<serde_json::Value>) -> (u16, String) {
    let req = c.agent().request(method, url).set("Authorization", &format!("token {token}"));
    let res = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

fn status(res: Result<ureq::Response, ureq::Error>) -> u16 {
    match res {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn host_to_host_routes_take_node_certificates_and_membership_takes_the_operator() {
    let c = TestCluster::start_tls(2, Options { fake_gpus: 0, ..Options::default() });
    c.wait_ready(&[1, 2], Duration::from_secs(60));
    let base = c.host(1).url.clone();
    let interrupt = format!("{base}/api/kernels/{NO_KERNEL}/interrupt?replica=local");
    let channels = format!("{base}/api/kernels/{NO_KERNEL}/channels?replica=local");

    // Attack: the users' token on host-to-host routes -> 403, counted.
    let before = metric(&c, 1, "not_a_node");
    assert_eq!(with_token(&c, TOKEN, "POST", &interrupt, None).0, 403);
    assert_eq!(with_token(&c, TOKEN, "GET", &channels, None).0, 403);
    let members = format!("{base}/api/v1/cluster/members");
    let forged = c
        .agent()
        .post(&members)
        .set("Authorization", &format!("token {TOKEN}"))
        .set(notebookosd::cluster::control::meta::FORWARDED_HEADER, "1")
        .send_json(json!({ "node_id": 7, "raft_addr": "127.0.0.1:1" }));
    assert_eq!(status(forged), 403, "a 'forwarded' call with the users' token");
    // A node certificate claiming to be another host.
    assert_eq!(as_node(&c, 2, 1, "POST", &interrupt, false), 403);
    assert_eq!(metric(&c, 1, "not_a_node") - before, 4.0);
    // Legitimate: host 2's certificate, naming host 2, passes authentication (no such kernel here: 404).
    assert_eq!(as_node(&c, 2, 2, "POST", &interrupt, false), 404);

    // The same on the internal routes themselves (what new hosts call): the users' token and a
    // certificate naming another host -> 403, counted; the host's own certificate -> 404.
    let before = metric(&c, 1, "not_a_node");
    for action in ["interrupt", "restart"] {
        let internal = format!("{base}/internal/v1/replicas/{NO_KERNEL}/{action}");
        assert_eq!(with_token(&c, TOKEN, "POST", &internal, None).0, 403, "{action}");
        assert_eq!(as_node(&c, 2, 1, "POST", &internal, false), 403, "{action}");
        assert_eq!(as_node(&c, 2, 2, "POST", &internal, false), 404, "{action}");
    }
    let internal_channels = format!("{base}/internal/v1/replicas/{NO_KERNEL}/channels");
    assert_eq!(with_token(&c, TOKEN, "GET", &internal_channels, None).0, 403);
    assert_eq!(metric(&c, 1, "not_a_node") - before, 5.0);

    // Attack: the users' token, or a host's certificate, on membership -> 403, counted.
    let before = metric(&c, 1, "not_an_operator");
    let (code, body) =
        with_token(&c, TOKEN, "POST", &members, Some(json!({ "node_id": 7, "raft_addr": "127.0.0.1:1" })));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("operator token"), "{body}");
    assert_eq!(as_node(&c, 2, 2, "DELETE", &format!("{members}/2"), false), 403);
    // A node key alone, even on a call marked forwarded: membership also takes the operator token.
    assert_eq!(
        as_node(&c, 2, 2, "DELETE", &format!("{members}/2"), true),
        403,
        "a forwarded call without the operator token"
    );
    let leave = format!("{base}/api/v1/cluster/leave");
    assert_eq!(as_node(&c, 2, 2, "POST", &leave, true), 403, "leaving (a membership change) with a node key alone");
    // The users' token creating a kernel record directly (that would bypass the `[limits]`
    // caps of `POST /api/kernels`) -> 403, and no record.
    let records = format!("{base}/api/v1/cluster/kernels");
    let (code, body) = with_token(&c, TOKEN, "POST", &records, Some(json!({ "name": "python3", "gpus": 0 })));
    assert_eq!(code, 403, "{body}");
    // The users' token moving a replica (the meta leader's call, or a host's for a waiting cell).
    let migrate = format!("{base}/api/v1/cluster/kernels/{NO_KERNEL}/migrate");
    let (code, body) = with_token(&c, TOKEN, "POST", &migrate, Some(json!({ "reason": "all_yield" })));
    assert_eq!(code, 403, "{body}");
    // The users' token on a canary register of the meta group.
    let canary = format!("{base}/api/v1/cluster/canary");
    let (code, body) =
        with_token(&c, TOKEN, "POST", &canary, Some(json!({ "op": "write", "name": "probe", "value": "u" })));
    assert_eq!(code, 403, "{body}");
    assert_eq!(as_node(&c, 2, 2, "POST", &canary, true), 403, "a canary call with a node key alone");
    assert_eq!(metric(&c, 1, "not_an_operator") - before, 8.0);
    // Legitimate: the operator may ask; an unknown kernel is 404, a bad body 422, nothing moves.
    let (code, body) = with_token(&c, OPERATOR_TOKEN, "POST", &migrate, Some(json!({ "reason": "all_yield" })));
    assert_eq!(code, 404, "{body}");
    let (code, body) = with_token(&c, OPERATOR_TOKEN, "POST", &migrate, Some(json!({ "reason": "whim" })));
    assert!(code == 400 || code == 422, "{code} {body}");
    assert_eq!(c.up_seen_by(1), vec![1, 2], "nothing changed");
    assert_eq!(c.get(1, "/api/v1/cluster/kernels").1, json!([]), "no kernel record");
    // Legitimate: the operator's canary, written through one host and read through the other
    // (linearizable), compared-and-swapped; the users' write above left nothing.
    let canary_on = |node: u64, body: serde_json::Value| {
        let (code, text) =
            with_token(&c, OPERATOR_TOKEN, "POST", &format!("{}/api/v1/cluster/canary", c.host(node).url), Some(body));
        (code, serde_json::from_str::<serde_json::Value>(&text).unwrap_or(json!(text)))
    };
    assert_eq!(canary_on(2, json!({ "op": "read", "name": "probe" })), (200, json!({ "value": null })));
    assert_eq!(canary_on(1, json!({ "op": "write", "name": "probe", "value": "a" })).0, 200);
    assert_eq!(canary_on(2, json!({ "op": "read", "name": "probe" })), (200, json!({ "value": "a" })));
    let swap = |expected: &str| json!({ "op": "cas", "name": "probe", "expected": expected, "new": "b" });
    assert_eq!(canary_on(2, swap("z")), (200, json!({ "value": "a", "ok": false })), "a CAS from the wrong value");
    assert_eq!(canary_on(2, swap("a")), (200, json!({ "value": "b", "ok": true })));
    assert_eq!(canary_on(1, json!({ "op": "read", "name": "probe" })), (200, json!({ "value": "b" })));
    // Bad input: a name outside the register namespace, an oversized value, an unknown op.
    let (code, body) = canary_on(1, json!({ "op": "read", "name": "../kernels/x" }));
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("canary name"), "{body}");
    let (code, body) = canary_on(1, json!({ "op": "write", "name": "probe", "value": "v".repeat(257) }));
    assert_eq!(code, 400, "{body}");
    let (code, body) = canary_on(1, json!({ "op": "delete", "name": "probe" }));
    assert!(code == 400 || code == 422, "{code} {body}");

    // Attack: adding a node id that is already a member (it would take over its raft traffic).
    let before = metric(&c, 1, "member_exists");
    let (code, body) =
        with_token(&c, OPERATOR_TOKEN, "POST", &members, Some(json!({ "node_id": 2, "raft_addr": "127.0.0.1:1" })));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("host 2 is already a member"), "{body}");
    assert!(metric(&c, 1, "member_exists") + metric(&c, 2, "member_exists") - before >= 1.0);
    // Legitimate: the operator removes a host that is not a member (a no-op), on either host:
    // whichever is not the meta leader forwards it with its node certificate and the token.
    for node in [1, 2] {
        let url = format!("{}/api/v1/cluster/members/99", c.host(node).url);
        let (code, body) = with_token(&c, OPERATOR_TOKEN, "DELETE", &url, None);
        assert_eq!(code, 200, "host {node}: {body}");
    }
    c.wait_ready(&[1, 2], Duration::from_secs(30));
}

#[test]
fn without_node_certificates_hosts_call_each_other_with_the_operator_token_never_the_users() {
    // A loopback cluster without a PKI (explicit config; the dev flags always make one):
    // there are no certificates to check, so host-to-host routes take the operator token.
    let c = TestCluster::start(2, Options { fake_gpus: 0, ..Options::default() });
    c.wait_ready(&[1, 2], Duration::from_secs(60));
    let base = c.host(1).url.clone();
    let interrupt = format!("{base}/api/kernels/{NO_KERNEL}/interrupt?replica=local");
    let members = format!("{base}/api/v1/cluster/members");

    // Attack: the users' token on a host-to-host route, and on a "forwarded" membership call.
    let before = metric(&c, 1, "not_an_operator");
    assert_eq!(with_token(&c, TOKEN, "POST", &interrupt, None).0, 403);
    let forged = c
        .agent()
        .post(&members)
        .set("Authorization", &format!("token {TOKEN}"))
        .set(notebookosd::cluster::control::meta::FORWARDED_HEADER, "1")
        .send_json(json!({ "node_id": 7, "raft_addr": "127.0.0.1:1" }));
    assert_eq!(status(forged), 403, "a 'forwarded' call with the users' token");
    assert_eq!(metric(&c, 1, "not_an_operator") - before, 2.0);
    assert_eq!(c.up_seen_by(1), vec![1, 2], "nothing changed");

    // Legitimate: what a host sends (the operator token) passes authentication (404: no such
    // kernel), and the operator's call made on either host is forwarded to the leader.
    assert_eq!(with_token(&c, OPERATOR_TOKEN, "POST", &interrupt, None).0, 404);
    let internal = format!("{base}/internal/v1/replicas/{NO_KERNEL}/interrupt");
    assert_eq!(with_token(&c, TOKEN, "POST", &internal, None).0, 403, "the users' token on an internal route");
    assert_eq!(with_token(&c, OPERATOR_TOKEN, "POST", &internal, None).0, 404);
    for node in [1, 2] {
        let url = format!("{}/api/v1/cluster/members/99", c.host(node).url);
        let (code, body) = with_token(&c, OPERATOR_TOKEN, "DELETE", &url, None);
        assert_eq!(code, 200, "host {node}: {body}");
    }
}
