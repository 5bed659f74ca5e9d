//! `gpu_hours_per_day` on a real daemon with a fake GPU (docs/users.md, Quotas): alice's
//! limit is 0.0001 GPU-hours (0.36 GPU-seconds); after a GPU cell of about a second, her
//! next GPU cell is refused with an error reply naming the limit and the numbers, while
//! bob's GPU cell on the same GPU still runs. The refusal is counted in the metrics and
//! written to the audit log.

use std::process::Stdio;

use futures_util::StreamExt;
use nbos_test_support::cell::run_cell_on;
use nbos_test_support::{http, start_daemon};
use notebookosd::link::client::GatewayClient;
use sha2::{Digest, Sha256};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";
const OPERATOR: &str = "operator-token-0123456789abcdef";

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

async fn run(url: &str, token: &str, kernel: &str, code: &str) -> nbos_test_support::cell::CellOutcome {
    let client = GatewayClient::new(url, Some(token.to_owned()));
    let (mut tx, mut rx) = client.connect_channels(kernel, false).await.expect("channels").split();
    run_cell_on(&mut tx, &mut rx, code).await
}

fn metric(text: &str, prefix: &str, has: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix) && l.contains(has))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_past_their_gpu_hours_today_is_refused_a_gpu_cell_and_others_run() {
    let files = tempfile::tempdir().expect("tmp");
    let users = files.path().join("users.toml");
    let text = format!(
        "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\n\n[[user]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\n",
        sha(ALICE),
        sha(BOB)
    );
    std::fs::write(&users, text).expect("users file");
    let audit = files.path().join("audit.log");
    let operator = files.path().join("operator-token");
    std::fs::write(&operator, format!("{OPERATOR}\n")).expect("operator token");
    let d = start_daemon(&[], Stdio::null(), |c| {
        let token = c.config.http.token_file.clone();
        c.tokens(&token.expect("token file"), Some(&operator));
        c.fake_gpus(1).subscription_ratio(4.0);
        c.config.auth.users_file = Some(users.clone());
        c.config.auth.audit_log = Some(audit.clone());
        c.config.limits.user.gpu_hours_per_day = Some(0.0001);
    });
    let url = d.url.clone();
    let u = url.clone();
    let (alice, bob) = tokio::task::spawn_blocking(move || {
        let create = |token: &str| {
            let (code, body) =
                http("POST", &format!("{u}/api/kernels"), Some(token), Some(r#"{"name": "python3", "gpus": 1}"#));
            assert_eq!(code, 201, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).expect("model")["id"].as_str().expect("id").to_owned()
        };
        (create(ALICE), create(BOB))
    })
    .await
    .expect("create");

    let first = run(&url, ALICE, &alice, "import time; time.sleep(1.2); 'slept'").await;
    assert_eq!(first.value(), "'slept'", "{first:?}");
    let refused = run(&url, ALICE, &alice, "1 + 1").await;
    assert_eq!(refused.status, "error", "{refused:?}");
    let error = refused.error.clone().unwrap_or_default();
    assert!(error.contains("GpuHoursQuota"), "{refused:?}");
    assert!(
        error.contains("limits.user.gpu_hours_per_day = 0.0001: alice used 0.000") && error.contains("today (UTC)"),
        "{refused:?}"
    );
    let other = run(&url, BOB, &bob, "2 + 2").await;
    assert_eq!(other.value(), "4", "bob's GPU cell runs: {other:?}");

    let (_, metrics) =
        tokio::task::spawn_blocking(move || http("GET", &format!("{url}/metrics"), Some(OPERATOR), None))
            .await
            .expect("metrics");
    assert!(metric(&metrics, "notebookos_refused_total{", "quota_gpu_hours") >= 1.0, "{metrics}");
    let alices = metric(&metrics, "notebookos_user_refusals_total{", "user=\"alice\",reason=\"quota_gpu_hours\"")
        + metric(&metrics, "notebookos_user_refusals_total{", "reason=\"quota_gpu_hours\",user=\"alice\"");
    assert!(alices >= 1.0, "{metrics}");
    let log = std::fs::read_to_string(&audit).expect("audit log");
    let line = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["action"] == "execute" && l["user"] == "alice")
        .unwrap_or_else(|| panic!("the refused cell's audit line: {log}"));
    assert_eq!(line["outcome"], "refused", "{line}");
    assert_eq!(line["kernel"], alice.as_str(), "{line}");
    assert!(line["detail"].as_str().is_some_and(|d| d.starts_with("limits.user.gpu_hours_per_day")), "{line}");
}
