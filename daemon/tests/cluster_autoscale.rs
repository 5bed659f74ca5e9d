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

/// Stops whatever daemons the provider started, however the test ends. Declared before the
/// cluster, so that it runs after the cluster's hosts (and a provider call in flight with
/// them) were stopped: it finds the daemons by their config path under the provider's
/// directory (`/proc/*/cmdline`), as their pid files may be gone with the cluster's directory.
struct ProviderHosts(PathBuf);

impl Drop for ProviderHosts {
    fn drop(&mut self) {
        if self.0.as_os_str().is_empty() {
            return;
        }
        let needle = format!("{}/", self.0.display());
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
            if String::from_utf8_lossy(&cmdline).contains(&needle) {
                // SAFETY: kill(2) of a process whose command line names this test's provider
                // directory (a daemon the provider started, or its kernels).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
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
    members_up_via(c, 1)
}

fn members_up_via(c: &TestCluster, host: u64) -> Vec<u64> {
    let (_, st) = c.get(host, "/api/v1/cluster/status");
    st["members"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["up"] == true).filter_map(|m| m["node_id"].as_u64()).collect())
        .unwrap_or_default()
}

/// `line`'s value summed over the test's own hosts (only the meta leader counts).
fn metric(c: &TestCluster, line: &str) -> f64 {
    [1, 2, 3]
        .iter()
        .filter_map(|h| c.agent().get(&format!("{}/metrics", c.host(*h).url)).call().ok()?.into_string().ok())
        .flat_map(|t| t.lines().filter_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok()).collect::<Vec<_>>())
        .sum()
}

/// Three hosts with one GPU each at ratio 1 (they hold exactly one one-GPU kernel), whose
/// autoscaler (every second, `extra` lines added to `[autoscale]`) runs the example provider
/// behind `wrapper` (argv put before it, possibly none; `{dir}` is the cluster's directory). Returns the cluster and the
/// provider's directory. `seed_overlay` goes into the test's own hosts' configs only.
/// A client of host `h`'s gateway (TLS with the test's CA).
fn gateway_of(c: &TestCluster, h: u64) -> GatewayClient {
    let ca = c.dir().join("pki/ca.pem");
    GatewayClient::new(&c.host(h).url, Some(TOKEN.to_owned()))
        .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("tls"))
}

/// A one-GPU kernel created through host 1: its id.
fn create_kernel(c: &TestCluster) -> String {
    let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 1 }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    model["id"].as_str().expect("id").to_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Three seeds with the exec provider; `extra` ends the `[autoscale]` table (`min_hosts`
/// is 3 unless it says otherwise).
fn autoscaled(wrapper: &[&str], extra: &str, seed_overlay: &str) -> (TestCluster, PathBuf) {
    // One GPU per host at ratio 1: three hosts hold exactly one one-GPU kernel.
    let mut c =
        TestCluster::create_tls(3, Options { fake_gpus: 1, subscription_ratio: Some(1.0), ..Options::default() });
    let dir = c.dir().to_owned();
    let provided = dir.join("provided");
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
    let mut command: Vec<String> = wrapper.iter().map(|a| a.replace("{dir}", &dir.display().to_string())).collect();
    command.extend([
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
    ]);
    let autoscale = format!(
        "\n[autoscale]\nprovider = \"exec\"\ncommand = {command:?}\nrule = \"notebookos\"\n{min}\
         max_hosts = 6\ninterval = \"1s\"\nspare_hosts = 0\npeak_window = \"2s\"\nplacement_wait = \"120s\"\n{extra}",
        min = if extra.contains("min_hosts") { "" } else { "min_hosts = 3\n" }
    );
    for id in 1..=3 {
        c.reconfigure(id, |config| {
            config.overlay(&autoscale).expect("[autoscale]");
            config.overlay(seed_overlay).expect("the seeds' own overlay");
        });
        c.restart(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    // While the hosts start one by one, the leader may see two and ask for a third: wait
    // until any such host was released again, so that the test starts from three idle hosts.
    wait_for(Duration::from_secs(90), "three idle hosts after the start", || {
        (members_up(&c) == vec![1, 2, 3] && live_provider_pids(&provided).is_empty() && released_all(&c)).then_some(())
    });
    (c, provided)
}

#[test]
fn the_example_provider_scales_out_for_kernels_and_back_in_when_they_go() {
    let mut guard = ProviderHosts(PathBuf::new());
    // A minimum of one host: the scale-in would go below the three seeds, and must not.
    let (c, provided) = autoscaled(&[], "min_hosts = 1\n", "");
    guard.0 = provided.clone();
    let gateway = |h: u64| gateway_of(&c, h);
    let rt = runtime();
    let create = || create_kernel(&c);
    let out_ok = "notebookos_autoscale_hosts_total{direction=\"out\",result=\"ok\"} ";
    let released = "notebookos_autoscale_hosts_total{direction=\"in\",result=\"ok\"} ";
    let (out0, in0) = (metric(&c, out_ok), metric(&c, released));
    let k1 = create();
    assert_eq!(members_up(&c), vec![1, 2, 3], "no scale-out while kernels fit");
    // A second kernel does not fit: the leader asks the provider for three hosts, and the
    // request waits for them instead of failing.
    let k2 = create();
    let up = members_up(&c);
    assert_eq!(up.len(), 6, "three hosts were added: {up:?}");
    assert_eq!(live_provider_pids(&provided).len(), 3);
    assert_eq!(metric(&c, out_ok), out0 + 3.0);
    for k in [&k1, &k2] {
        let mut client = rt.block_on(CellClient::connect(&gateway(1), k)).expect("connect");
        let run = rt.block_on(client.run("v = 6 * 7\nprint(v)", CELL_TIMEOUT)).expect("cell");
        assert_eq!(run.reply["status"], "ok", "{run:?}");
        assert_eq!(run.stdout.trim(), "42");
    }
    // The second kernel goes: its idle hosts are drained, leave and are stopped.
    let (code, v) = c.delete(1, &format!("/api/kernels/{k2}"));
    assert_eq!(code, 204, "{v}");
    wait_for(Duration::from_secs(120), "the cluster to scale back to three hosts", || {
        (members_up(&c).len() == 3 && live_provider_pids(&provided).is_empty() && metric(&c, released) == in0 + 3.0)
            .then_some(())
    });
    assert_eq!(members_up(&c), vec![1, 2, 3], "the provider's hosts were the ones released");
    // No kernel lost: the first one still answers, with its state.
    let mut client = rt.block_on(CellClient::connect(&gateway(2), &k1)).expect("connect");
    let run = rt.block_on(client.run("print(v + 1)", CELL_TIMEOUT)).expect("cell after scale-in");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    assert_eq!(run.stdout.trim(), "43");
    drop(client);
    // With no kernel left, min_hosts = 1 would let the autoscaler release two seeds: the
    // seeds stay through more decisions (interval 1 s, peak window 2 s).
    let (code, v) = c.delete(1, &format!("/api/kernels/{k1}"));
    assert_eq!(code, 204, "{v}");
    let decisions = |c: &TestCluster| metric(c, "notebookos_autoscale_decisions_total ");
    let d0 = decisions(&c);
    wait_for(Duration::from_secs(60), "five autoscaler decisions with no kernel left (past the peak window)", || {
        (decisions(&c) >= d0 + 5.0).then_some(())
    });
    assert_eq!(members_up(&c), vec![1, 2, 3], "a seed was released");
    assert_eq!(metric(&c, released), in0 + 3.0, "a seed was released");
}

/// Every host the autoscaler asked for has been released (none left unreleased).
fn released_all(c: &TestCluster) -> bool {
    let out = metric(c, "notebookos_autoscale_hosts_total{direction=\"out\",result=\"ok\"} ");
    let released = metric(c, "notebookos_autoscale_hosts_total{direction=\"in\",result=\"ok\"} ");
    out == released && metric(c, "notebookos_autoscale_hosts_unreleased ") == 0.0
}

/// The meta leader among the test's own hosts (the provider's never lead here: they join later).
fn meta_leader(c: &TestCluster) -> u64 {
    wait_for(Duration::from_secs(60), "a meta leader", || {
        let (_, st) = c.get(1, "/api/v1/cluster/status");
        st["meta_leader"].as_u64().filter(|l| (1..=3).contains(l))
    })
}

fn replica_hosts(c: &TestCluster, via: u64, kernel: &str) -> Vec<u64> {
    let (code, record) = c.get(via, &format!("/api/v1/cluster/kernels/{kernel}"));
    assert_eq!(code, 200, "{record}");
    let mut hosts: Vec<u64> =
        record["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["node_id"].as_u64()).collect();
    hosts.sort_unstable();
    hosts
}

/// The flaky provider's argv (its state in the cluster's directory), to put before the example's.
fn flaky_provider(fail_releases: u32) -> Vec<String> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/providers/flaky-provider.py");
    vec![
        python.display().to_string(),
        script.display().to_string(),
        "--state".into(),
        "{dir}/flaky".into(),
        "--fail-releases".into(),
        fail_releases.to_string(),
        "--".into(),
    ]
}

#[test]
fn a_host_with_a_replica_is_released_only_after_it_moves_and_failed_releases_are_retried() {
    // Three hosts may go at once: with the first kernel deleted, two of the test's own hosts
    // are empty and the third to go holds a replica of the second kernel, which has to move
    // first (to the meta leader, the only host left without one). The provider fails each
    // host's first two release calls (an exit status of 3, then {"ok": false}).
    let wrapper = flaky_provider(2);
    let mut guard = ProviderHosts(PathBuf::new());
    let (c, provided) = autoscaled(&wrapper.iter().map(String::as_str).collect::<Vec<_>>(), "max_release = 3\n", "");
    guard.0 = provided.clone();
    let gateway = |h: u64| gateway_of(&c, h);
    let rt = runtime();
    let create = || create_kernel(&c);
    let series = |result: &str| format!("notebookos_autoscale_hosts_total{{direction=\"in\",result=\"{result}\"}} ");
    let (ok_before, failed_before) = (metric(&c, &series("ok")), metric(&c, &series("failed")));
    let released = |result: &str| metric(&c, &series(result)) - if result == "ok" { ok_before } else { failed_before };
    let k1 = create();
    let k2 = create();
    let leader = meta_leader(&c);
    let theirs = replica_hosts(&c, leader, &k2);
    assert!(theirs.iter().all(|h| *h > 3), "the second kernel went to the provider's hosts: {theirs:?}");
    let mut client = rt.block_on(CellClient::connect(&gateway(leader), &k2)).expect("connect");
    let run = rt.block_on(client.run("v = 6 * 7\nprint(v)", CELL_TIMEOUT)).expect("cell");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    drop(client);

    let (code, v) = c.delete(leader, &format!("/api/kernels/{k1}"));
    assert_eq!(code, 204, "{v}");
    let up = wait_for(Duration::from_secs(150), "three hosts released, each after two failed provider calls", || {
        scaled_in(&c, leader, &provided, &theirs).filter(|_| released("ok") == 3.0)
    });
    // Each host's two failed provider calls count (and a release given up, e.g. a remove the
    // meta group refused while another host left, counts as failed too).
    let log = std::fs::read_to_string(c.dir().join("flaky/requests.log")).expect("the flaky provider's log");
    assert_eq!(log.lines().filter(|l| l.ends_with(": failed")).count(), 6, "{log}");
    assert!(released("failed") >= 6.0, "every failed provider call counted: {}", released("failed"));
    assert_eq!(metric(&c, "notebookos_autoscale_hosts_unreleased "), 0.0);
    // At least one of the provider's hosts, each holding a replica, went (which: the drain
    // choice's tie-break on GPUs held idle by the cell above), stopped only once its replica
    // had moved: the kernel's replicas are all on the hosts that stay, and it kept its state.
    assert!(up.contains(&leader), "the meta leader stays: {up:?}");
    let gone: Vec<u64> = theirs.iter().copied().filter(|h| !up.contains(h)).collect();
    assert!(!gone.is_empty(), "a host with a replica went: members {up:?}, provider's hosts {theirs:?}");
    assert_eq!(replica_hosts(&c, leader, &k2), up, "the replicas on hosts {gone:?} moved");
    let mut client = rt.block_on(CellClient::connect(&gateway(leader), &k2)).expect("connect");
    let run = rt.block_on(client.run("print(v + 1)", CELL_TIMEOUT)).expect("cell after scale-in");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    assert_eq!(run.stdout.trim(), "43");
}

/// Once the scale-in is over: three members left, and each of the provider's hosts `theirs`
/// that is no longer one was stopped by the provider. The members then.
fn scaled_in(c: &TestCluster, leader: u64, provided: &Path, theirs: &[u64]) -> Option<Vec<u64>> {
    let up = members_up_via(c, leader);
    let stopped = |h: &u64| !provided.join(format!("host{h}/pid")).exists();
    (up.len() == 3 && theirs.iter().filter(|h| !up.contains(h)).all(stopped)).then_some(up)
}

/// Host `node`'s entry in the cluster status as `via` sees it.
fn member(c: &TestCluster, via: u64, node: u64) -> Option<serde_json::Value> {
    let (_, st) = c.get(via, "/api/v1/cluster/status");
    st["members"].as_array()?.iter().find(|m| m["node_id"].as_u64() == Some(node)).cloned()
}

#[test]
fn a_release_whose_replica_cannot_move_in_time_is_given_up_the_host_kept_and_placement_avoids_it() {
    // Kernel starts on the test's own hosts wait while a gate file exists: the replica moving
    // off a released host to the meta leader cannot become ready, so the release's drain
    // (20 s here: longer than a move takes on a loaded machine, shorter than the 30 s a
    // kernel has to open its ports, and a start that failed is tried again) runs out.
    let bin = nbos_test_support::daemon::kernel_traversable_tempdir();
    let gate = bin.path().join("hold-kernel-starts");
    let wrapper = bin.path().join("python");
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    std::fs::write(&wrapper, format!("#!/bin/sh\nwhile [ -e {gate:?} ]; do sleep 0.1; done\nexec {python:?} \"$@\"\n"))
        .expect("python wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let seeds = format!("[kernel]\npython = {wrapper:?}\nprewarm_max = 0\n");
    let mut guard = ProviderHosts(PathBuf::new());
    let (c, provided) = autoscaled(&[], "max_release = 3\ndrain_timeout = \"20s\"\n", &seeds);
    guard.0 = provided.clone();
    let gateway = |h: u64| gateway_of(&c, h);
    let rt = runtime();
    let create = || create_kernel(&c);
    let failed = "notebookos_autoscale_hosts_total{direction=\"in\",result=\"failed\"} ";
    let failed0 = metric(&c, failed);
    let k1 = create();
    let k2 = create();
    let leader = meta_leader(&c);
    let theirs = replica_hosts(&c, leader, &k2);
    let mut client = rt.block_on(CellClient::connect(&gateway(leader), &k2)).expect("connect");
    let run = rt.block_on(client.run("v = 6 * 7\nprint(v)", CELL_TIMEOUT)).expect("cell");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    drop(client);

    std::fs::write(&gate, "").expect("gate");
    let (code, v) = c.delete(leader, &format!("/api/kernels/{k1}"));
    assert_eq!(code, 204, "{v}");
    // Which of the provider's hosts goes: drain::choose's tie-break on GPUs held idle.
    let last = wait_for(Duration::from_secs(60), "a host with a replica to be draining", || {
        theirs.iter().copied().find(|h| member(&c, leader, *h).is_some_and(|m| m["draining"] == true))
    });
    let pid_file = provided.join(format!("host{last}/pid"));
    // A kernel placed while hosts are being released lands on none of them.
    let (code, k3) =
        c.post_as_operator(leader, "/api/v1/cluster/kernels", serde_json::json!({ "name": "python3", "gpus": 0 }));
    assert!((200..300).contains(&code), "{k3}");
    let placed: Vec<u64> =
        k3["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["node_id"].as_u64()).collect();
    assert!(!placed.contains(&last), "placed on host {last}, which is being released: {placed:?}");
    let up = members_up_via(&c, leader);
    assert!(placed.iter().all(|h| up.contains(h)), "placed on {placed:?}, members {up:?}");

    // The drain runs out: the release is given up and counted, the host is back in service
    // (no draining mark) with its replica, and the provider was not asked to stop it.
    wait_for(Duration::from_secs(90), "the release to be given up and the host kept", || {
        let m = member(&c, leader, last)?;
        (metric(&c, failed) > failed0 && m["draining"] == false && m["up"] == true).then_some(())
    });
    assert!(pid_file.exists(), "the provider was not asked to release host {last}");
    assert!(replica_hosts(&c, leader, &k2).contains(&last), "host {last} still holds its replica");

    // Once kernels start again, the moves finish and later decisions take the cluster down to
    // three hosts (the one kept, or another whose replicas moved, perhaps to it).
    std::fs::remove_file(&gate).expect("open the gate");
    let up = wait_for(Duration::from_secs(150), "the scale-in to finish", || scaled_in(&c, leader, &provided, &theirs));
    assert_eq!(replica_hosts(&c, leader, &k2), up, "every replica on a host that stays");
    let mut client = rt.block_on(CellClient::connect(&gateway(leader), &k2)).expect("connect");
    let run = rt.block_on(client.run("print(v + 1)", CELL_TIMEOUT)).expect("cell after scale-in");
    assert_eq!(run.reply["status"], "ok", "{run:?}");
    assert_eq!(run.stdout.trim(), "43");
}
