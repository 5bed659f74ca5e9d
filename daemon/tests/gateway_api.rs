//! The Kernel Gateway API of a real notebookosd with a real ipykernel, from Rust:
//! kernelspecs, kernel lifecycle, both WebSocket encodings (JSON with a float
//! `date` and no `channel`; `v1.kernel.websocket.jupyter.org`), token checks,
//! 404s, malformed messages dropped and counted, and `nbos kernels` /
//! `nbos bench cell --json`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use notebookosd::jupyter::{ws, Channel, Message};
use notebookosd::link::client::GatewayClient;
use tokio_tungstenite::tungstenite::Message as WsFrame;

use nbos_test_support::{bins, bins::python, http, start_daemon, Daemon, TOKEN};
use notebookosd::config::LogFormat;

fn start() -> Daemon {
    start_daemon(&[], Stdio::null(), |c| c.config.log.format = LogFormat::Text)
}

fn metric(url: &str, prefix: &str) -> f64 {
    let (_, text) = http("GET", &format!("{url}/metrics"), None, None);
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Waits for the execute_reply and result of `msg_id` on a JSON WebSocket.
async fn json_result<S>(rx: &mut S, msg_id: &str) -> (String, Option<String>)
where
    S: futures_util::Stream<Item = Result<WsFrame, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    // `execute_result` comes on IOPub and may arrive after the shell's `execute_reply`: the
    // cell is over once both the reply and its `idle` status (same parent) are in.
    let mut value = None;
    let mut status = None;
    let mut idle = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while status.is_none() || !idle {
        let frame =
            tokio::time::timeout_at(deadline, rx.next()).await.expect("reply in time").expect("open").expect("ok");
        let WsFrame::Text(t) = frame else { continue };
        let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("json");
        if v["parent_header"]["msg_id"] != msg_id {
            continue;
        }
        if v["msg_type"] == "execute_result" {
            assert_eq!(v["channel"], "iopub");
            value = v["content"]["data"]["text/plain"].as_str().map(str::to_owned);
        }
        if v["msg_type"] == "status" && v["content"]["execution_state"] == "idle" {
            assert_eq!(v["channel"], "iopub");
            idle = true;
        }
        if v["msg_type"] == "execute_reply" {
            assert_eq!(v["channel"], "shell");
            status = Some(v["content"]["status"].as_str().unwrap_or("").to_owned());
        }
    }
    (status.unwrap_or_default(), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_gateway_api_end_to_end() {
    let d = start();
    let url = d.url.clone();
    let u = url.clone();
    let (kernel_id, pid) = tokio::task::spawn_blocking(move || {
        // Kernelspecs, with GPU requests in their metadata.
        let (code, body) = http("GET", &format!("{u}/api/kernelspecs"), Some(TOKEN), None);
        assert_eq!(code, 200);
        let specs: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(specs["default"], "python3");
        assert_eq!(specs["kernelspecs"]["notebookos-python-4gpu"]["spec"]["metadata"]["notebookos"]["gpus"], 4);
        assert_eq!(http("GET", &format!("{u}/api/kernelspecs/python3"), Some(TOKEN), None).0, 200);
        // Auth and 404.
        assert_eq!(http("GET", &format!("{u}/api/kernels"), None, None).0, 401);
        assert_eq!(http("GET", &format!("{u}/api/kernels"), Some("wrong"), None).0, 401);
        assert_eq!(http("GET", &format!("{u}/api/kernels/nope"), Some(TOKEN), None).0, 404);
        assert_eq!(http("POST", &format!("{u}/api/kernels"), Some(TOKEN), Some("{not json")).0, 400);
        // Create.
        let (code, body) = http("POST", &format!("{u}/api/kernels"), Some(TOKEN), Some(r#"{"name":"python3"}"#));
        assert_eq!(code, 201, "{body}");
        let model: serde_json::Value = serde_json::from_str(&body).expect("json");
        (model["id"].as_str().expect("id").to_owned(), model["pids"][0].as_u64().expect("pid"))
    })
    .await
    .expect("join");
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    let client = GatewayClient::new(&url, Some(TOKEN.to_owned()));
    // JSON encoding, as jupyter_server's gateway client sends it: no channel, float date.
    let (mut tx, mut rx) = client.connect_channels(&kernel_id, false).await.expect("ws").split();
    tx.send(WsFrame::Text(
        r#"{"header":{"msg_id":"j1","msg_type":"execute_request","session":"s","date":1700000000.25,"version":"5.3"},
            "parent_header":{},"metadata":{},"content":{"code":"21*2","silent":false}}"#
            .into(),
    ))
    .await
    .expect("send");
    assert_eq!(json_result(&mut rx, "j1").await, ("ok".to_owned(), Some("42".to_owned())));

    // Malformed messages are dropped and counted; the kernel keeps working.
    let before = metric(&url, "notebookos_messages_dropped_total{source=\"websocket\",reason=\"malformed_json\"}");
    tx.send(WsFrame::Text("{oops".into())).await.expect("send");
    tx.send(WsFrame::Binary(vec![0u8, 0, 0, 9, 1].into())).await.expect("send");
    tx.send(WsFrame::Text(r#"{"header":{"msg_id":"j2","msg_type":"execute_request"},"content":{"code":"7"}}"#.into()))
        .await
        .expect("send");
    assert_eq!(json_result(&mut rx, "j2").await, ("ok".to_owned(), Some("7".to_owned())));
    let after = metric(&url, "notebookos_messages_dropped_total{source=\"websocket\",reason=\"malformed_json\"}");
    assert_eq!(after - before, 1.0);
    assert!(metric(&url, "notebookos_messages_dropped_total{source=\"websocket\",reason=\"bad_binary\"}") >= 1.0);
    drop((tx, rx));

    // v1 binary subprotocol.
    let (mut tx, mut rx) = client.connect_channels(&kernel_id, true).await.expect("v1 ws").split();
    let req = Message::new(
        "execute_request",
        "s",
        "v1",
        std::time::SystemTime::now(),
        None,
        &serde_json::json!({"code": "'v' + '1'", "silent": false}),
    );
    tx.send(WsFrame::Binary(ws::to_v1_binary(Channel::Shell, &req).into())).await.expect("send");
    let mut got = None;
    while got.is_none() {
        let frame = tokio::time::timeout(Duration::from_secs(60), rx.next()).await.expect("in time").expect("open");
        let WsFrame::Binary(b) = frame.expect("ok") else { panic!("v1 frames are binary") };
        let (ch, m) = ws::from_v1_binary(&b).expect("decodes");
        if ch == Channel::Iopub && m.header().expect("h").msg_type == "execute_result" {
            got = m.content_json().expect("c")["data"]["text/plain"].as_str().map(str::to_owned);
        }
    }
    assert_eq!(got.as_deref(), Some("'v1'"));
    // This socket stays open through the DELETE below.
    let (_open_tx, mut open_rx) = (tx, rx);

    // nbos kernels lists it, as a table and as JSON.
    let out =
        Command::new(bins::nbos()).args(["--url", &url, "kernels"]).env("NBOS_TOKEN", TOKEN).output().expect("nbos");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&kernel_id));
    let out = Command::new(bins::nbos())
        .args(["--url", &url, "kernels", "--json"])
        .env("NBOS_TOKEN", TOKEN)
        .output()
        .expect("nbos");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list["kernels"][0]["id"], kernel_id.as_str());
    assert_eq!(list["gpus"]["total"], 0);

    // Delete: the process goes away, the id is 404 afterwards.
    let u = url.clone();
    let id = kernel_id.clone();
    tokio::task::spawn_blocking(move || {
        assert_eq!(http("DELETE", &format!("{u}/api/kernels/{id}"), Some(TOKEN), None).0, 204);
        assert_eq!(http("GET", &format!("{u}/api/kernels/{id}"), Some(TOKEN), None).0, 404);
    })
    .await
    .expect("join");
    // A client still connected is told the kernel is gone: its socket is closed (1001), not
    // left open to a kernel that no longer exists.
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(10), open_rx.next()).await.expect("closed in time") {
            Some(Ok(WsFrame::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("the socket ended without a close frame: {other:?}"),
        }
    };
    let close = close.expect("a close frame with a code");
    assert_eq!(u16::from(close.code), 1001, "{close:?}");
    assert_eq!(close.reason.as_str(), "the kernel was shut down");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(Instant::now() < deadline, "kernel process {pid} still alive after DELETE");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bench_cell_prints_one_json_object_with_the_promised_keys() {
    let out = Command::new(bins::nbos())
        .args(["bench", "cell", "--json", "--cells", "10", "--warmup", "2", "--python"])
        .arg(python())
        .output()
        .expect("nbos bench cell");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for k in ["gateway_p50_ms", "gateway_p99_ms", "direct_p50_ms", "direct_p99_ms", "added_p50_ms"] {
        assert!(v[k].is_number(), "{k} missing in {v}");
    }
    assert!(v["gateway_p50_ms"].as_f64() > Some(0.0) && v["direct_p50_ms"].as_f64() > Some(0.0));
}

#[test]
fn kernel_proxy_and_install_kernelspec_refuse_bad_input_with_clear_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    // A connection file that does not exist, is not JSON, or asks for ipc.
    let missing = dir.path().join("missing.json");
    let out = Command::new(bins::nbos()).arg("kernel-proxy").arg("-f").arg(&missing).output().expect("nbos");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.json"), "{err}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").expect("write");
    let out = Command::new(bins::nbos()).arg("kernel-proxy").arg("-f").arg(&bad).output().expect("nbos");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("parsing connection file"));
    let ipc = dir.path().join("ipc.json");
    std::fs::write(
        &ipc,
        r#"{"shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"ip":"kernel","key":"k",
            "transport":"ipc","signature_scheme":"hmac-sha256"}"#,
    )
    .expect("write");
    let out = Command::new(bins::nbos()).arg("kernel-proxy").arg("-f").arg(&ipc).output().expect("nbos");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("\"ipc\" is not supported"));

    // install-kernelspec: a name that is not a directory name, or an unknown gateway spec.
    let kernels = dir.path().join("kernels");
    for args in [["--name", "../evil"], ["--kernel-name", "no-such-spec"]] {
        let out = Command::new(bins::nbos())
            .arg("install-kernelspec")
            .args(args)
            .arg("--kernels-dir")
            .arg(&kernels)
            .output()
            .expect("nbos");
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
    assert!(!kernels.exists(), "a refused install wrote files");
    // A good one writes kernel.json running this nbos.
    let out = Command::new(bins::nbos())
        .args(["install-kernelspec", "--name", "nbos-test", "--gpus", "1", "--kernels-dir"])
        .arg(&kernels)
        .output()
        .expect("nbos");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kernels.join("nbos-test/kernel.json")).expect("kernel.json"))
            .expect("json");
    assert_eq!(spec["argv"][1], "kernel-proxy");
    assert_eq!(spec["argv"][3], "{connection_file}");
    assert_eq!(spec["metadata"]["notebookos"]["gpus"], 1);
}

/// The daemon's runtime directory, from the `--config` file it was started with (the test
/// harness puts `run/` next to it).
fn runtime_dir_of(d: &Daemon) -> std::path::PathBuf {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", d.child.id())).expect("cmdline");
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let config = args.iter().skip_while(|a| *a != "--config").nth(1).expect("--config");
    Path::new(config).parent().expect("config dir").join("run")
}

#[test]
fn kernel_ids_that_are_not_uuids_are_no_kernel_and_touch_nothing() {
    let d = start();
    let u = &d.url;
    let run = runtime_dir_of(&d);
    assert!(run.join("endpoint.json").exists(), "{} is not the runtime dir", run.display());
    let upper = uuid::Uuid::new_v4().to_string().to_uppercase();
    for id in ["..%2F..", "%2E%2E", "not-a-uuid", "..%2F..%2Fetc", upper.as_str()] {
        for (method, path) in [
            ("GET", format!("/api/kernels/{id}")),
            ("DELETE", format!("/api/kernels/{id}")),
            ("POST", format!("/api/kernels/{id}/interrupt")),
            ("POST", format!("/api/kernels/{id}/restart")),
            ("GET", format!("/api/kernels/{id}/channels")),
        ] {
            let (code, body) = http(method, &format!("{u}{path}"), Some(TOKEN), None);
            // `%2E%2E` may be resolved as `..` by the client or refused by the router
            // itself; every other id reaches the handler and is an unknown kernel.
            assert!(code == 404 || code == 400, "{method} {path}: {code} {body}");
            if id != "%2E%2E" {
                assert_eq!(code, 404, "{method} {path}: {body}");
                let err: serde_json::Value = serde_json::from_str(&body).expect("json error");
                assert_eq!(err["reason"], "Not Found", "{method} {path}: {body}");
                assert!(err["message"].as_str().is_some_and(|m| m.contains("Kernel does not exist")), "{body}");
            }
        }
    }
    // Nothing was removed, and kernels still come and go.
    assert!(run.join("endpoint.json").exists(), "the runtime dir lost its files");
    let (code, body) = http("POST", &format!("{u}/api/kernels"), Some(TOKEN), Some(r#"{"name":"python3"}"#));
    assert_eq!(code, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("json");
    let id = model["id"].as_str().expect("id");
    // Kernels' directories are on disk, in the state directory beside `run`.
    let kernels = run.with_file_name("state").join("kernels");
    assert!(kernels.join(id).is_dir(), "kernel dir missing under {}", kernels.display());
    assert_eq!(http("DELETE", &format!("{u}/api/kernels/{id}"), Some(TOKEN), None).0, 204);
    assert_eq!(http("GET", &format!("{u}/api/kernels/{id}"), Some(TOKEN), None).0, 404);
    assert!(run.is_dir() && run.join("endpoint.json").exists());
}
