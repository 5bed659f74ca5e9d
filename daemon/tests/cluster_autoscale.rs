//! Autoscaling (issue 14) through the example `exec` provider
//! (`examples/autoscale/local-dev-provider.py`), which starts and stops real local daemons
//! that join the cluster: a kernel that does not fit makes the meta leader scale out (its
//! `POST /api/kernels` waits and then succeeds), and once it is deleted the idle hosts are
//! drained, leave and are stopped, with no kernel lost and every cell answered.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nbos_test_support::cell_client::CellClient;
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;

fn nbos() -> std::path::PathBuf {
    nbos_test_support::bins::nbos()
}
const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

const CELL_TIMEOUT: Duration = Duration::from_secs(120);

/// Stops whatever daemons the provider started, however the test ends.
struct ProviderHosts(PathBuf);

impl Drop for ProviderHosts {
    fn drop(&mut self) {
        for pid in live_provider_pids(&self.0) {
            // SAFETY: kill(2) of a daemon the provider started for this test (its pid file).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Pids of the provider's daemons that have not been released.
fn live_provider_pids(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("pid")).ok()?.trim().parse::<i32>().ok())
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        .filter(|pid| unsafe { libc::kill(*pid, 0) } == 0)
        .collect()
}

fn members_up(c: &TestCluster) -> Vec<u64> {
    let (_, st) = c.get(1, "/api/v1/cluster/status");
    st["members"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["up"] == true).filter_map(|m| m["node_id"].as_u64()).collect())
        .unwrap_or_default()
}

fn metric(c: &TestCluster, line: &str) -> f64 {
    [1, 2, 3]
        .iter()
        .filter_map(|h| c.agent().get(&format!("{}/metrics", c.host(*h).url)).call().ok()?.into_string().ok())
        .flat_map(|t| t.lines().filter_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok()).collect::<Vec<_>>())
        .sum()
}

#[test]
fn the_example_provider_scales_out_for_kernels_and_back_in_when_they_go() {
    // One GPU per host at ratio 1: three hosts hold exactly one one-GPU kernel.
    let mut c =
        TestCluster::create_tls(3, Options { fake_gpus: 1, subscription_ratio: Some(1.0), ..Options::default() });
    let dir = c.dir().to_owned();
    let provided = dir.join("provided");
    let _guard = ProviderHosts(provided.clone());
    // The provider's hosts: configured like the test's own, with node certificates 4..=8.
    let pki = dir.join("pki");
    let tls4 = raft_store::NodeTlsFiles::in_dir(&pki, 4);
    let per_host = |p: &Path| p.display().to_string().replace("node-4", "node-{node_id}");
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let seeds = c.seed_list().iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let template = format!(
        "[node]\nname = \"auto{{node_id}}\"\nstate_dir = \"{{dir}}/state\"\nruntime_dir = \"{{dir}}/run\"\n\
         [http]\nlisten = \"127.0.0.1:0\"\ntoken_file = {token:?}\noperator_token_file = {operator:?}\n\
         tls = {{{{ cert = \"{cert}\", key = \"{key}\", client_ca = {ca:?} }}}}\n\
         [gpu]\ndriver = \"fake\"\nfake_gpus = 1\nsubscription_ratio = 1.0\n[observer]\nmode = \"procfs\"\n\
         [kernel]\npython = {python:?}\n\
         [cluster]\nenabled = true\nnode_id = {{node_id}}\nraft_listen = \"{{raft_listen}}\"\nseeds = [{seeds}]\n\
         host_ttl = \"1s\"\nobject_store = \"file://{objects}\"\n\
         tls = {{{{ ca_cert = {ca:?}, cert = \"{cert}\", key = \"{key}\" }}}}\n",
        token = dir.join("token"),
        operator = dir.join("operator-token"),
        cert = per_host(&tls4.cert),
        key = per_host(&tls4.key),
        ca = tls4.ca_cert,
        objects = dir.join("objects").display(),
    );
    let template_path = dir.join("provider-template.toml");
    std::fs::write(&template_path, template).expect("template");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/autoscale/local-dev-provider.py");
    let command = [
        python.display().to_string(),
        script.display().to_string(),
        "--dir".into(),
        provided.display().to_string(),
        "--template".into(),
        template_path.display().to_string(),
        "--first-node-id".into(),
        "4".into(),
        "--notebookosd".into(),
        NOTEBOOKOSD.into(),
        "--nbos".into(),
        nbos().display().to_string(),
        "--ca-cert".into(),
        tls4.ca_cert.display().to_string(),
        "--token-file".into(),
        dir.join("token").display().to_string(),
        "--operator-token-file".into(),
        dir.join("operator-token").display().to_string(),
    ];
    let autoscale = format!(
        "\n[autoscale]\nprovider = \"exec\"\ncommand = {command:?}\nrule = \"notebookos\"\nmin_hosts = 3\n\
         max_hosts = 6\ninterval = \"1s\"\nspare_hosts = 0\npeak_window = \"2s\"\nplacement_wait = \"120s\"\n"
    );
    for id in 1..=3 {
        c.reconfigure(id, |config| {
            config.overlay(&autoscale).expect("[autoscale]");
        });
        c.restart(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));

    let ca = dir.join("pki/ca.pem");
    let gateway = |h: u64| {
        GatewayClient::new(&c.host(h).url, Some(TOKEN.to_owned()))
            .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("tls"))
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let create = || {
        let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 1 }));
        assert_eq!(code, 201, "create: {model}\n{}", c.logs());
        model["id"].as_str().expect("id").to_owned()
    };
    let k1 = create();
    assert_eq!(members_up(&c), vec![1, 2, 3], "no scale-out while kernels fit");
    // A second kernel does not fit: the leader asks the provider for three hosts, and the
    // request waits for them instead of failing.
    let k2 = create();
    let up = members_up(&c);
    assert_eq!(up.len(), 6, "three hosts were added: {up:?}");
    assert_eq!(live_provider_pids(&provided).len(), 3);
    assert_eq!(metric(&c, "notebookos_autoscale_hosts_total{direction=\"out\",result=\"ok\"} "), 3.0);
    for k in [&k1, &k2] {
        let mut client = rt.block_on(CellClient::connect(&gateway(1), k)).expect("connect");
        let run = rt.block_on(client.run("v = 6 * 7\nprint(v)", CELL_TIMEOUT)).expect("cell");
        assert_eq!(run.reply["status"], "ok", "{run:?}");
        assert_eq!(run.stdout.trim(), "42");
    }
    // The second kernel goes: its idle hosts are drained, leave and are stopped.
    let (code, v) = c.delete(1, &format!("/api/kernels/{k2}"));
    assert_eq!(code, 204, "{v}");
    let released = "notebookos_autoscale_hosts_total{direction=\"in\",result=\"ok\"} ";
    wait_for(Duration::from_secs(120), "the cluster to scale back to three hosts", || {
        (members_up(&c).len() == 3 && live_provider_pids(&provided).is_empty() && metric(&c, released) == 3.0)
            .then_some(())
    });
    assert_eq!(members_up(&c), vec![1, 2, 3], "the provider's hosts were the ones released");
    // No kernel lost: the first one still answers, with its state.
    let mut client = rt.block_on(CellClient::connect(&gateway(2), &k1)).expect("connect");
    let run = rt.block_on(client.run("print(v + 1)", CELL_TIMEOUT)).expect("cell after scale-in");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    assert_eq!(run.stdout.trim(), "43");
}
