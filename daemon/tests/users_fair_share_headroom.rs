//! `gpu.fair_share_headroom` on a real daemon with two fake GPUs (docs/design.md, fair
//! share): alice has used a GPU for a few seconds and holds one with a long cell; her second
//! kernel's cell may not take the last GPU, which bob's idle kernel could ask for, so it
//! waits, and bob's cell, sent after it, runs at once. Without the headroom alice's second
//! cell would take the GPU and bob's would wait for one of her long cells to end.

use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use nbos_test_support::cell::run_cell_on;
use nbos_test_support::wait::wait_until;
use nbos_test_support::{http, start_daemon};
use notebookosd::link::client::GatewayClient;
use sha2::{Digest, Sha256};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";
const OPERATOR: &str = "operator-token-0123456789abcdef";
/// How long alice's long cells sleep: far longer than bob's cell takes to start and run.
const LONG_S: u64 = 90;

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

async fn run(url: &str, token: &str, kernel: &str, code: &str) -> nbos_test_support::cell::CellOutcome {
    let client = GatewayClient::new(url, Some(token.to_owned()));
    let (mut tx, mut rx) = client.connect_channels(kernel, false).await.expect("channels").split();
    run_cell_on(&mut tx, &mut rx, code).await
}

/// The host's GPU view (`GET /api/v1/gpus`).
fn gpus(url: &str) -> serde_json::Value {
    let (code, body) = http("GET", &format!("{url}/api/v1/gpus"), Some(OPERATOR), None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("snapshot")
}

fn waiting_kernels(url: &str) -> Vec<String> {
    gpus(url)["waiting"]
        .as_array()
        .map(|w| w.iter().filter_map(|p| p[0].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_users_cell_leaves_the_gpu_a_light_users_idle_kernel_asks_for() {
    let files = tempfile::tempdir().expect("tmp");
    let users = files.path().join("users.toml");
    let text = format!(
        "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n\n[[user]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
        sha(ALICE),
        sha(BOB)
    );
    std::fs::write(&users, text).expect("users file");
    let operator = files.path().join("operator-token");
    std::fs::write(&operator, format!("{OPERATOR}\n")).expect("operator token");
    let d = start_daemon(&[], Stdio::null(), |c| {
        let token = c.config.http.token_file.clone();
        c.tokens(&token.expect("token file"), Some(&operator));
        c.fake_gpus(2).subscription_ratio(4.0);
        c.config.auth.users_file = Some(users.clone());
        c.config.gpu.fair_share = true;
        c.config.gpu.fair_share_headroom = true;
    });
    let url = d.url.clone();
    let u = url.clone();
    let (a1, a2, b) = tokio::task::spawn_blocking(move || {
        let create = |token: &str| {
            let (code, body) =
                http("POST", &format!("{u}/api/kernels"), Some(token), Some(r#"{"name": "python3", "gpus": 1}"#));
            assert_eq!(code, 201, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).expect("model")["id"].as_str().expect("id").to_owned()
        };
        (create(ALICE), create(ALICE), create(BOB))
    })
    .await
    .expect("create");

    // Alice's recent GPU time: 4 GPU-seconds, above the mean of the two users (2) by more
    // than the fair share's band (1): she is over her share, bob (none) within his.
    let warm = run(&url, ALICE, &a1, "import time; time.sleep(4); 'warm'").await;
    assert_eq!(warm.result.as_deref(), Some("'warm'"), "{warm:?}");
    let long = format!("import time; time.sleep({LONG_S}); 'done'");
    let (url1, k1, code1) = (url.clone(), a1.clone(), long.clone());
    let first = tokio::spawn(async move { run(&url1, ALICE, &k1, &code1).await });
    let u = url.clone();
    tokio::task::spawn_blocking(move || {
        wait_until("alice's long cell holds a GPU", Duration::from_secs(60), || gpus(&u)["committed"] == 1);
    })
    .await
    .expect("wait");
    let (url2, k2) = (url.clone(), a2.clone());
    let second = tokio::spawn(async move { run(&url2, ALICE, &k2, &long).await });
    let (u, k) = (url.clone(), a2.clone());
    tokio::task::spawn_blocking(move || {
        wait_until("alice's second cell waits", Duration::from_secs(60), || waiting_kernels(&u).contains(&k));
    })
    .await
    .expect("wait");
    assert_eq!(gpus(&url)["committed"], 1, "the second GPU stays free for bob: {}", gpus(&url));

    let bobs = run(&url, BOB, &b, "2 + 2").await;
    assert_eq!(bobs.result.as_deref(), Some("4"), "{bobs:?}");
    assert!(!first.is_finished(), "bob's cell ran while alice's first long cell still held its GPU");
    assert!(waiting_kernels(&url).contains(&a2), "alice's second cell still waits: {}", gpus(&url));

    // Clean up: the long cells' kernels go (their sleeps with them), then the daemon.
    first.abort();
    second.abort();
    let u = url.clone();
    tokio::task::spawn_blocking(move || {
        for k in [a1, a2, b] {
            let (code, body) = http("DELETE", &format!("{u}/api/kernels/{k}"), Some(OPERATOR), None);
            assert!(code == 204 || code == 200, "delete {k}: {code} {body}");
        }
    })
    .await
    .expect("delete");
    drop(d);
}
