//! Users against each other, on a real daemon with real ipykernels (`[auth]` users file,
//! docs/users.md). The attack list, each beside the legitimate path:
//!
//! - bob lists, gets, deletes, interrupts, restarts and opens the channels of alice's
//!   kernel: each answer is byte for byte an unknown kernel's (apart from the id);
//! - a wrong token, the users' shared token, and the token's SHA-256 itself are 401;
//! - `KERNEL_USERNAME=bob` in alice's create does not make bob the owner;
//! - quotas refuse with the limit named; an admin sees and deletes alice's kernel; the
//!   operator's `nbos kernels` shows owners; the audit log has the session's lines;
//! - a client certificate names its user (its Common Name); a node certificate names none;
//! - in a 3-host cluster, bob asking hosts 2 and 3 for the kernel alice made on host 1 is
//!   404 (every host enforces the record's owner), and alice's own requests work there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nbos_test_support::http::request;
use nbos_test_support::{bins, http, start_daemon, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;
use sha2::{Digest, Sha256};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";
const OPERATOR: &str = "operator-token-0123456789abcdef";
const UNKNOWN: &str = "00000000-0000-4000-8000-000000000000";

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// alice (group ml), bob, and an admin; `extra` more entries.
fn users_file(path: &Path, extra: &str) {
    let text = format!(
        "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\ngroups = [\"ml\"]\n\n\
         [[user]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n\n\
         [[user]]\nname = \"root-admin\"\ntoken_sha256 = \"{}\"\ngroups = [\"admins\"]\n{extra}",
        sha(ALICE),
        sha(BOB),
        sha(ADMIN)
    );
    std::fs::write(path, text).expect("users file");
}

/// `body` with `id` replaced by the unknown id: what an unknown kernel's answer must equal.
fn as_unknown(body: &str, id: &str) -> String {
    body.replace(id, UNKNOWN)
}

/// Bob's requests on `id` answer exactly what they answer on a kernel that does not exist.
fn assert_hidden(base: &str, token: &str, id: &str) {
    for (method, path) in [
        ("GET", "/api/kernels/{}"),
        ("DELETE", "/api/kernels/{}"),
        ("POST", "/api/kernels/{}/interrupt"),
        ("POST", "/api/kernels/{}/restart"),
        ("GET", "/api/kernels/{}/channels"),
    ] {
        let theirs = http(method, &format!("{base}{}", path.replace("{}", id)), Some(token), None);
        let unknown = http(method, &format!("{base}{}", path.replace("{}", UNKNOWN)), Some(token), None);
        assert_eq!(theirs.0, 404, "{method} {path} of another user's kernel: {theirs:?}");
        assert_eq!(
            (theirs.0, as_unknown(&theirs.1, id)),
            unknown,
            "{method} {path}: another user's kernel answers as an unknown one"
        );
    }
}

fn ids(list: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(list).expect("kernel list");
    v.as_array().expect("array").iter().filter_map(|k| k["id"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_see_and_touch_only_their_own_kernels() {
    let files = tempfile::tempdir().expect("tmp");
    let users = files.path().join("users.toml");
    users_file(&users, "");
    let operator = files.path().join("operator-token");
    std::fs::write(&operator, format!("{OPERATOR}\n")).expect("operator token");
    let audit = files.path().join("audit.log");
    let d = start_daemon(&[], Stdio::null(), |c| {
        let token = c.config.http.token_file.clone();
        c.tokens(&token.expect("token file"), Some(&operator));
        c.config.auth.users_file = Some(users.clone());
        c.config.auth.admin_group = Some("admins".into());
        c.config.auth.audit_log = Some(audit.clone());
        c.config.limits.user.kernels = Some(2);
        c.config.limits.user.gpus = Some(1);
    });
    let url = d.url.clone();
    let u = url.clone();
    let alice_kernel = tokio::task::spawn_blocking(move || {
        let kernels = format!("{u}/api/kernels");
        // Credentials that name nobody.
        for (token, what) in [("wrong-token-0123456789", "a wrong token"), (TOKEN, "the shared token")] {
            assert_eq!(http("GET", &kernels, Some(token), None).0, 401, "{what}");
        }
        assert_eq!(http("GET", &kernels, Some(&sha(ALICE)), None).0, 401, "the hash is not the token");
        assert_eq!(http("GET", &kernels, None, None).0, 401, "no credential");

        // alice's kernel is alice's, whatever KERNEL_USERNAME says.
        let body = r#"{"name": "python3", "env": {"KERNEL_USERNAME": "bob"}}"#;
        let (code, created) = http("POST", &kernels, Some(ALICE), Some(body));
        assert_eq!(code, 201, "{created}");
        let created: serde_json::Value = serde_json::from_str(&created).expect("model");
        assert_eq!(created["owner"], "alice");
        let id = created["id"].as_str().expect("id").to_owned();

        assert_eq!(ids(&http("GET", &kernels, Some(ALICE), None).1), vec![id.clone()]);
        assert!(ids(&http("GET", &kernels, Some(BOB), None).1).is_empty(), "bob's list has none of alice's");
        assert_hidden(&u, BOB, &id);
        let (code, mine) = http("GET", &format!("{kernels}/{id}"), Some(ALICE), None);
        assert_eq!(code, 200, "{mine}");

        // Quotas: the limit's key, the user and the numbers.
        let (code, second) = http("POST", &kernels, Some(ALICE), Some(r#"{"name": "python3"}"#));
        assert_eq!(code, 201, "{second}");
        let second_id =
            serde_json::from_str::<serde_json::Value>(&second).expect("model")["id"].as_str().expect("id").to_owned();
        let (code, refused) = http("POST", &kernels, Some(ALICE), Some(r#"{"name": "python3"}"#));
        assert_eq!(code, 429, "{refused}");
        assert!(refused.contains("limits.user.kernels = 2: alice has 2 kernels"), "{refused}");
        let (code, refused) = http("POST", &kernels, Some(BOB), Some(r#"{"name": "python3", "gpus": 2}"#));
        assert_eq!(code, 429, "{refused}");
        assert!(refused.contains("limits.user.gpus = 1: bob has 0 GPUs committed, 2 more asked"), "{refused}");

        // The operator's `nbos kernels` names the owners.
        let out = Command::new(bins::nbos())
            .args(["--url", &u, "kernels"])
            .env("NBOS_TOKEN", OPERATOR)
            .output()
            .expect("nbos kernels");
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{table} {}", String::from_utf8_lossy(&out.stderr));
        let row = table.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("a row for {id}: {table}"));
        assert!(row.contains(" alice "), "{table}");

        // An admin sees every kernel and may delete alice's.
        let mut all = ids(&http("GET", &kernels, Some(ADMIN), None).1);
        all.sort();
        let mut both = vec![id.clone(), second_id.clone()];
        both.sort();
        assert_eq!(all, both);
        assert_eq!(http("DELETE", &format!("{kernels}/{id}"), Some(ADMIN), None).0, 204);
        assert_eq!(ids(&http("GET", &kernels, Some(ALICE), None).1), vec![second_id.clone()]);
        second_id
    })
    .await
    .expect("session");

    // alice's own channels open; bob's were a 404 above.
    let alice = GatewayClient::new(&url, Some(ALICE.to_owned()));
    alice.connect_channels(&alice_kernel, false).await.expect("alice's channels");
    let bob = GatewayClient::new(&url, Some(BOB.to_owned()));
    assert!(bob.connect_channels(&alice_kernel, false).await.is_err(), "bob's channels of alice's kernel");

    // Metrics: bob's refusals under his name.
    let (_, metrics) = http("GET", &format!("{url}/metrics"), None, None);
    let refusals = metrics
        .lines()
        .find(|l| {
            l.starts_with("notebookos_user_refusals_total{") && l.contains("user=\"bob\"") && l.contains("not_found")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(refusals.is_some_and(|n| n >= 5.0), "{metrics}");
    assert!(metrics.contains("notebookos_user_kernels{user=\"alice\"} 1"), "{metrics}");

    // The audit log: one JSON line per action and refusal, in a private file.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&audit).expect("audit log").permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&audit).expect("audit log");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let has = |user: &str, action: &str, outcome: &str| {
        lines.iter().any(|l| l["user"] == user && l["action"] == action && l["outcome"] == outcome)
    };
    assert!(has("unknown", "authenticate", "unauthenticated"), "{text}");
    assert!(has("alice", "create", "ok"), "{text}");
    for action in ["get", "delete", "interrupt", "restart", "channels"] {
        assert!(has("bob", action, "not_found"), "bob's {action}: {text}");
    }
    assert!(has("alice", "create", "refused"), "the quota refusal: {text}");
    assert!(has("root-admin", "delete", "ok"), "{text}");
    assert!(has("alice", "channels", "ok"), "{text}");
    assert!(
        lines.iter().all(|l| l["time"].as_str().is_some_and(|t| t.ends_with('Z'))
            && l["source"].as_str().is_some_and(|s| s.starts_with("127.0.0.1:"))),
        "every line has a UTC time and the client's address: {text}"
    );
}

#[test]
fn every_host_enforces_the_owner_of_a_cluster_kernel() {
    let files = tempfile::tempdir().expect("tmp");
    let users = files.path().join("users.toml");
    // The harness reads status with the cluster's token: an admin user of its own here.
    users_file(
        &users,
        &format!("\n[[user]]\nname = \"harness\"\ntoken_sha256 = \"{}\"\ngroups = [\"admins\"]\n", sha(TOKEN)),
    );
    let overlay = format!("[auth]\nusers_file = \"{}\"\nadmin_group = \"admins\"\n", users.display());
    let c = TestCluster::launch(3, Options { overlay, ..Options::default() }).expect("a ready cluster");
    let agent = c.agent().clone();
    let on = |node: u64, method: &str, path: &str, token: &str, body: Option<serde_json::Value>| {
        request(&agent, method, &c.host(node).url, path, body, token)
    };
    let (code, created) = on(1, "POST", "/api/kernels", ALICE, Some(serde_json::json!({"name": "python3"})));
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["owner"], "alice");
    let id = created["id"].as_str().expect("id").to_owned();
    // The cluster's status names kernels (hosts' memory records, moves): once the hosts
    // report alice's, an admin sees it there and bob, on any host, sees neither it nor its count.
    nbos_test_support::wait_until("alice's kernel in the hosts' load records", Duration::from_secs(60), || {
        on(1, "GET", "/api/v1/cluster/status", TOKEN, None).1.to_string().contains(&id)
    });
    for node in [1, 2, 3] {
        let (code, status) = on(node, "GET", "/api/v1/cluster/status", BOB, None);
        assert_eq!(code, 200, "bob's status on host {node}: {status}");
        assert!(!status.to_string().contains(&id), "bob sees alice's kernel in host {node}'s status: {status}");
        assert_eq!(status["kernels"], 0, "bob's count on host {node}");
        assert_eq!(status["members"].as_array().map(Vec::len), Some(3), "bob still sees the hosts");
    }
    assert_eq!(on(2, "GET", "/api/v1/cluster/status", ALICE, None).1["kernels"], 1, "alice's count");
    for node in [2, 3] {
        for path in [format!("/api/kernels/{id}"), format!("/api/v1/cluster/kernels/{id}")] {
            let theirs = on(node, "GET", &path, BOB, None);
            let unknown = on(node, "GET", &path.replace(&id, UNKNOWN), BOB, None);
            assert_eq!(theirs.0, 404, "bob on host {node}: {path}: {theirs:?}");
            let hidden: serde_json::Value =
                serde_json::from_str(&as_unknown(&theirs.1.to_string(), &id)).expect("json");
            assert_eq!((theirs.0, hidden), unknown, "host {node}: {path}");
        }
        assert_hidden(&c.host(node).url, BOB, &id);
        let (_, list) = on(node, "GET", "/api/kernels", BOB, None);
        assert_eq!(list, serde_json::json!([]), "bob's list on host {node}");
        let (_, records) = on(node, "GET", "/api/v1/cluster/kernels", BOB, None);
        assert_eq!(records, serde_json::json!([]), "bob's records on host {node}");
    }
    let (code, mine) = on(2, "GET", &format!("/api/kernels/{id}"), ALICE, None);
    assert_eq!(code, 200, "alice on host 2: {mine}");
    assert_eq!(mine["owner"], "alice");
    let (code, _) = on(3, "POST", &format!("/api/kernels/{id}/interrupt"), ALICE, None);
    assert_eq!(code, 204, "alice interrupts on host 3");
    let (code, _) = on(3, "DELETE", &format!("/api/kernels/{id}"), ALICE, None);
    assert_eq!(code, 204, "alice deletes on host 3");
}

/// `method path` over HTTPS as `identity` (a client certificate) or with `token`: status and body.
fn https(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    token: Option<&str>,
    method: &str,
    url: &str,
    body: Option<&str>,
) -> (u16, String) {
    let tls = notebookosd::link::tls::client_config(ca, identity).expect("client config");
    let agent = ureq::AgentBuilder::new().tls_config(tls).timeout(std::time::Duration::from_secs(120)).build();
    http::http_via(&agent, method, url, token, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_its_user_and_a_node_certificate_none() {
    let files = tempfile::tempdir().expect("tmp");
    let pki = notebookosd::pki::Pki::at(&files.path().join("pki"));
    pki.init().expect("pki");
    let node = pki.issue_node(1, &["localhost".into()], &["127.0.0.1".parse().expect("ip")]).expect("node cert");
    let alice = pki.issue_client("alice").expect("alice's certificate");
    let carol = pki.issue_client("carol").expect("carol's certificate");
    let users = files.path().join("users.toml");
    users_file(&users, "");
    let ca = pki.ca_cert();
    let d = start_daemon(&[], Stdio::null(), |c| {
        c.https(&node.cert, &node.key, &ca);
        c.config.auth.users_file = Some(users.clone());
        c.config.auth.client_certificate_users = true;
    });
    let url = d.url.clone();
    let (ca2, u) = (ca.clone(), url.clone());
    let (alice_cert, alice_key) = (alice.cert.clone(), alice.key.clone());
    let (carol_cert, carol_key) = (carol.cert.clone(), carol.key.clone());
    let id = tokio::task::spawn_blocking(move || {
        let kernels = format!("{u}/api/kernels");
        let as_alice = Some((alice_cert.as_path(), alice_key.as_path()));
        let (code, created) = https(&ca2, as_alice, None, "POST", &kernels, Some(r#"{"name": "python3"}"#));
        assert_eq!(code, 201, "{created}");
        let created: serde_json::Value = serde_json::from_str(&created).expect("model");
        assert_eq!(created["owner"], "alice", "the certificate's Common Name owns the kernel");
        let id = created["id"].as_str().expect("id").to_owned();
        // carol (a certificate, no users-file entry) and bob (a token) see nothing of it.
        let as_carol = Some((carol_cert.as_path(), carol_key.as_path()));
        assert_eq!(ids(&https(&ca2, as_carol, None, "GET", &kernels, None).1), Vec::<String>::new());
        let (code, _) = https(&ca2, as_carol, None, "GET", &format!("{kernels}/{id}"), None);
        assert_eq!(code, 404, "carol on alice's kernel");
        let (code, _) = https(&ca2, None, Some(BOB), "DELETE", &format!("{kernels}/{id}"), None);
        assert_eq!(code, 404, "bob on alice's kernel");
        // A host's certificate is no user's.
        let as_node = Some((node.cert.as_path(), node.key.as_path()));
        assert_eq!(https(&ca2, as_node, None, "GET", &kernels, None).0, 401, "a node certificate on the users' API");
        assert_eq!(ids(&https(&ca2, as_alice, None, "GET", &kernels, None).1), vec![id.clone()]);
        id
    })
    .await
    .expect("session");
    // The channels WebSocket, which jupyter_server opens with the certificate and no header.
    let tls = notebookosd::link::tls::client_config(&ca, Some((&alice.cert, &alice.key))).expect("tls");
    GatewayClient::new(&url, None).with_tls(tls).connect_channels(&id, false).await.expect("alice's channels");
    let tls = notebookosd::link::tls::client_config(&ca, Some((&carol.cert, &carol.key))).expect("tls");
    let refused = GatewayClient::new(&url, None).with_tls(tls).connect_channels(&id, false).await;
    assert!(refused.is_err(), "carol's channels of alice's kernel");
}
