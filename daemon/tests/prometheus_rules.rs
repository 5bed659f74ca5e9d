//! Prometheus and Grafana for real (`packaging/prometheus/`, `packaging/grafana/`):
//!
//! - `promtool` checks the rules and the example configuration and runs the rules' unit
//!   tests, which must fire and stay quiet for every alert and check every recording rule;
//! - three real daemons (a TLS cluster, one simulated GPU each, `gpu.idle_release = 1s`) run
//!   a kernel whose cells use the GPU; Debian's `prometheus` scrapes them with the rules
//!   loaded; through its HTTP API the test checks that every metric of the "Metrics
//!   reference" table of docs/operations.md is scraped with its documented labels (from all
//!   three hosts where it is always exported), that nothing undocumented is, that every rule
//!   evaluates, that every metric and label the rules and the dashboard use is on the
//!   daemons' `/metrics`, that every dashboard query returns data, and that
//!   `NotebookOSHostDown` goes pending for a killed host and only for it.
//!
//! Without `prometheus`/`promtool` (Debian package prometheus) the tests skip with the
//! reason, unless `NBOS_REQUIRE_PRIVILEGED=1` or `CI` is set: then they fail.

mod required;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use nbos_test_support::{run_cell_on, wait_for, CellOutcome, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as WsFrame;

/// Labels Prometheus adds to every scraped series (target labels).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Families of the metrics table exported only once counted (`event`) that the workload
/// of [`prometheus_scrapes_every_documented_metric_and_the_rules_and_dashboard_use_real_ones`]
/// produces, so they must be scraped; and what produces each.
const TRIGGERED: [(&str, &str); 10] = [
    ("notebookos_cells_total", "the cells run"),
    ("notebookos_kernels", "the kernel's replicas"),
    ("notebookos_http_requests_total", "the test's and Prometheus's requests"),
    ("notebookos_http_auth_refusals_total", "a request with a wrong token"),
    ("notebookos_refused_total", "LD_PRELOAD in the kernel's environment"),
    ("notebookos_messages_dropped_total", "a malformed message on the channels WebSocket"),
    ("notebookos_prewarm_takes_total", "the replicas' starts"),
    ("notebookos_gpu_evictions_total", "the idle release of the GPU after a GPU cell"),
    ("notebookos_sync_bytes_total", "the executor's namespace commit"),
    ("notebookos_sync_cells_applied_total", "the followers' applies"),
];

/// Metrics the dashboard must chart (the panels the operations guide describes).
const DASHBOARD_MUST_USE: [&str; 10] = [
    "notebookos_gpus_committed",
    "notebookos_gpus_idle_held",
    "notebookos_subscription_ratio",
    "notebookos_interactivity_delay_seconds_bucket",
    "notebookos_election_rounds_total",
    "notebookos_election_latency_seconds_bucket",
    "notebookos_gpu_evictions_total",
    "notebookos_gpu_restored_bytes_total",
    "notebookos_sync_export_seconds_bucket",
    "notebookos_kernels",
];

/// A cell that puts 64 Ki floats on the (simulated) GPU through the shim.
const GPU_CELL: &str = "from nbos_kernel import gpu\ndev = gpu.open_device()\nbuf = dev.buffer(1 << 16, 1.0)\n\
                        print('SUM', dev.sum(buf))";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `name` on `PATH`, or `None` after [`required::cannot_run`] (which fails under
/// `NBOS_REQUIRE_PRIVILEGED=1`; so does `CI` being set).
fn tool(name: &str, test: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
    });
    if found.is_none() {
        let why = format!("{name} is not installed (Debian package prometheus; scripts/install-deps.sh installs it)");
        assert!(std::env::var_os("CI").is_none(), "{test}: CI is set but it cannot run: {why}");
        required::cannot_run(test, &why);
    }
    found
}

// ------------------------------------------------------------------------------ promtool

/// Names after `- alert:` or `- record:` in a rules file.
fn rule_names(rules: &str, kind: &str) -> Vec<String> {
    let key = format!("- {kind}:");
    rules.lines().filter_map(|l| l.trim().strip_prefix(&key)).map(|n| n.trim().to_owned()).collect()
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_cover_every_rule() {
    const TEST: &str = "promtool_checks_the_rules_and_their_unit_tests_cover_every_rule";
    let Some(promtool) = tool("promtool", TEST) else { return };
    let dir = root().join("packaging/prometheus");
    for args in [
        ["check", "rules", "notebookos.rules.yml"],
        ["test", "rules", "notebookos.rules.test.yml"],
        ["check", "config", "prometheus.example.yml"],
    ] {
        let out = Command::new(&promtool).args(args).current_dir(&dir).output().expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {} ({}): {}\n{}{}",
            args.join(" "),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Every alert has a test where it fires and one where it stays quiet; every recording
    // rule is evaluated by a test.
    let rules = read(&dir.join("notebookos.rules.yml"));
    let tests = read(&dir.join("notebookos.rules.test.yml"));
    let alerts = rule_names(&rules, "alert");
    let records = rule_names(&rules, "record");
    assert!(alerts.len() >= 6 && !records.is_empty(), "rules found: {alerts:?} {records:?}");
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("- alertname:") else { continue };
        let expected = lines[i + 1..].iter().find_map(|l| l.strip_prefix("exp_alerts:")).map(str::trim);
        match expected {
            Some("[]") => quiet.insert(name.trim().to_owned()),
            Some(_) => fires.insert(name.trim().to_owned()),
            None => panic!("alert_rule_test of {name} without exp_alerts"),
        };
    }
    for a in &alerts {
        assert!(fires.contains(a), "no unit test where {a} fires");
        assert!(quiet.contains(a), "no unit test where {a} stays quiet");
    }
    let tested: BTreeSet<&str> = lines.iter().filter_map(|l| l.strip_prefix("- expr:")).map(str::trim).collect();
    for r in &records {
        assert!(tested.contains(r.as_str()), "no promql_expr_test evaluates the recording rule {r}");
    }
}

// ------------------------------------------------------------------------------ the docs' table

/// One row of the "Metrics reference" table of docs/operations.md.
#[derive(Debug)]
struct Documented {
    name: String,
    kind: String,
    labels: BTreeSet<String>,
    /// `always`, `GPUs`, `cluster`, `pool`, `guard` or `event`.
    exported: String,
}

impl Documented {
    /// The series names Prometheus stores for it.
    fn series(&self) -> Vec<String> {
        if self.kind == "histogram" {
            ["_bucket", "_sum", "_count"].iter().map(|s| format!("{}{s}", self.name)).collect()
        } else {
            vec![self.name.clone()]
        }
    }

    /// The name it is registered under in the code (counters get `_total` from the encoder).
    fn registered(&self) -> &str {
        if self.kind == "counter" {
            self.name.strip_suffix("_total").unwrap_or(&self.name)
        } else {
            &self.name
        }
    }
}

fn documented_metrics() -> Vec<Documented> {
    let path = root().join("docs/operations.md");
    let text = read(&path);
    let section = text
        .split("\n## Metrics reference\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no \"## Metrics reference\" section", path.display()));
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `notebookos_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 7, "{}: a metrics row needs 5 columns: {line}", path.display());
        let labels = match cells[3] {
            "—" => BTreeSet::new(),
            list => list.split(',').map(|l| l.trim().trim_matches('`').to_owned()).collect(),
        };
        let row = Documented {
            name: cells[1].trim_matches('`').to_owned(),
            kind: cells[2].to_owned(),
            labels,
            exported: cells[4].to_owned(),
        };
        assert!(["counter", "gauge", "histogram"].contains(&row.kind.as_str()), "type of {row:?}");
        assert!(row.kind != "counter" || row.name.ends_with("_total"), "a counter is stored as NAME_total: {row:?}");
        assert!(
            ["always", "GPUs", "cluster", "pool", "guard", "event"].contains(&row.exported.as_str()),
            "exported of {row:?}"
        );
        assert!(row.exported != "event" || !row.labels.is_empty(), "an event family has labels: {row:?}");
        rows.push(row);
    }
    let names: BTreeSet<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), rows.len(), "a metric is listed twice in {}", path.display());
    assert!(rows.len() > 40, "{}: only {} metrics in the table", path.display(), rows.len());
    rows
}

/// Metric names registered in the daemon's code (`register("notebookos_…"` and, in a file
/// with `sub_registry_with_prefix("P")`, `register("x"` as `P_x`), by name: the file.
fn registered_in_code() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    fn literal_after(text: &str, at: usize) -> Option<&str> {
        let rest = text[at..].trim_start();
        let rest = rest.strip_prefix('"')?;
        rest.split('"').next()
    }
    let mut files = Vec::new();
    // raft-store's registry is appended to the daemon's /metrics in cluster mode.
    for dir in ["daemon/src", "ebpf/src", "raft-store/src"] {
        walk(&root().join(dir), &mut files);
    }
    let mut names = BTreeMap::new();
    for f in files {
        let text = read(&f);
        let prefix = text
            .find("sub_registry_with_prefix(")
            .and_then(|at| literal_after(&text, at + "sub_registry_with_prefix(".len()));
        for (at, _) in text.match_indices(".register(") {
            let Some(name) = literal_after(&text, at + ".register(".len()) else { continue };
            let name = match prefix {
                _ if name.starts_with("notebookos_") => name.to_owned(),
                Some(p) => format!("{p}_{name}"),
                None => continue,
            };
            names.insert(name, f.clone());
        }
    }
    names
}

// ------------------------------------------------------------------------------ PromQL

/// What a PromQL expression refers to.
#[derive(Debug, Default)]
struct Uses {
    /// Selected series names and the label names of their matchers.
    selectors: Vec<(String, Vec<String>)>,
    /// Labels of `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`.
    grouping: Vec<String>,
}

fn skip_ws(chars: &[char], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// The index after the string literal starting at `i`.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() && chars[j] != quote {
        j += if chars[j] == '\\' && quote != '`' { 2 } else { 1 };
    }
    j + 1
}

fn ident_at(chars: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while chars.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':') {
        i += 1;
    }
    (chars[start..i].iter().collect(), i)
}

/// Label names of the matchers `{a="x", b=~"y"}` starting at `open`, and the index after `}`.
fn matcher_labels(chars: &[char], open: usize, expr: &str) -> (Vec<String>, usize) {
    let mut labels = Vec::new();
    let mut i = skip_ws(chars, open + 1);
    loop {
        match chars.get(i) {
            Some('}') => return (labels, i + 1),
            Some(',') => i = skip_ws(chars, i + 1),
            Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                let (label, end) = ident_at(chars, i);
                labels.push(label);
                i = skip_ws(chars, end);
                while chars.get(i).is_some_and(|c| matches!(c, '=' | '!' | '~')) {
                    i += 1;
                }
                i = skip_ws(chars, i);
                assert!(
                    chars.get(i).is_some_and(|c| matches!(c, '"' | '\'' | '`')),
                    "a matcher's value is not a string in {expr:?}"
                );
                i = skip_ws(chars, skip_string(chars, i));
            }
            _ => panic!("cannot read the label matchers of {expr:?}"),
        }
    }
}

/// Reads the label names and metric names an expression uses (strings, durations and
/// numbers skipped; functions and keywords told apart from series names).
fn promql_uses(expr: &str) -> Uses {
    const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];
    // Aggregations take `by (…)`/`without (…)` before or after their parentheses.
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i);
        } else if c == '[' {
            // A range or subquery duration.
            i = chars[i..].iter().position(|&c| c == ']').map_or(chars.len(), |p| i + p + 1);
        } else if c.is_ascii_digit() || c == '.' {
            while chars.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let (ident, end) = ident_at(&chars, i);
            let next = skip_ws(&chars, end);
            i = end;
            let grouping = ["by", "without", "on", "ignoring", "group_left", "group_right"];
            if chars.get(next) == Some(&'(') {
                if grouping.contains(&ident.as_str()) {
                    let close = chars[next..].iter().position(|&c| c == ')').map_or(chars.len(), |p| next + p);
                    let list: String = chars[next + 1..close].iter().collect();
                    uses.grouping.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned));
                    i = close + 1;
                }
                // Otherwise a function call.
            } else if !KEYWORDS.contains(&ident.to_ascii_lowercase().as_str())
                && !grouping.contains(&ident.as_str())
                && !AGGREGATIONS.contains(&ident.as_str())
            {
                let mut labels = Vec::new();
                if chars.get(next) == Some(&'{') {
                    (labels, i) = matcher_labels(&chars, next, expr);
                }
                uses.selectors.push((ident, labels));
            }
        } else if c == '{' {
            panic!("a selector without a metric name in {expr:?}");
        } else {
            i += 1;
        }
    }
    uses
}

/// A dashboard query with Grafana's variables replaced as a Prometheus query can run it.
fn substitute(expr: &str) -> String {
    expr.replace("${instance}", ".*")
        .replace("$instance", ".*")
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "5s")
        .replace("$__range_s", "300")
        .replace("$__range", "5m")
}

// ------------------------------------------------------------------------------ exposition

/// Sample names of an OpenMetrics text and, per name, the label names seen on it.
fn exposition_labels(text: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let chars: Vec<char> = line.chars().collect();
        let (name, end) = ident_at(&chars, 0);
        let labels = into.entry(name).or_default();
        if chars.get(end) == Some(&'{') {
            let (names, _) = matcher_labels(&chars, end, line);
            labels.extend(names);
        }
    }
}

// ------------------------------------------------------------------------------ Prometheus

/// A `prometheus` process with its own storage, stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(binary: &Path, config: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("prometheus tempdir");
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let listen = raft_store::service::free_loopback_addr().expect("free port");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("prometheus log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut p = Prometheus { child, url: format!("http://{listen}"), dir };
        wait_for(Duration::from_secs(30), "prometheus to be ready", || {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited at start ({status}):\n{}", p.log());
            }
            ureq::get(&format!("{}/-/ready", p.url)).timeout(Duration::from_secs(2)).call().ok().map(|_| ())
        });
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/{path}` with `params`; the `data` of a `success` answer.
    fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let mut req = ureq::get(&format!("{}/api/v1/{path}", self.url)).timeout(Duration::from_secs(10));
        for (k, v) in params {
            req = req.query(k, v);
        }
        let body: Value = match req.call() {
            Ok(r) => r.into_json().expect("prometheus JSON"),
            Err(ureq::Error::Status(code, r)) => {
                panic!("prometheus {path} {params:?}: {code} {}", r.into_string().unwrap_or_default())
            }
            Err(e) => panic!("prometheus {path} {params:?}: {e}\n{}", self.log()),
        };
        assert_eq!(body["status"], "success", "prometheus {path} {params:?}: {body}");
        body["data"].clone()
    }

    /// The instant vector of `query`.
    fn query(&self, query: &str) -> Vec<Value> {
        let data = self.api("query", &[("query", query)]);
        assert_eq!(data["resultType"], "vector", "{query}: {data}");
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sample_value(sample: &Value) -> f64 {
    sample["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

// ------------------------------------------------------------------------------ the workload

/// `/metrics` of every running host.
fn scrape_all(c: &TestCluster) -> Vec<String> {
    c.hosts
        .iter()
        .filter(|h| h.running())
        .map(|h| {
            let url = format!("{}/metrics", h.url);
            c.agent()
                .get(&url)
                .call()
                .unwrap_or_else(|e| panic!("GET {url}: {e}"))
                .into_string()
                .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        })
        .collect()
}

/// Starts the three hosts with `gpu.idle_release = 1s` and runs the workload that
/// [`TRIGGERED`] describes.
fn cluster_with_workload() -> TestCluster {
    // GPUs come back 1 s after a cell: the test sees an eviction soon.
    let idle_release = Some(Duration::from_secs(1));
    let c = TestCluster::start_tls(3, Options { fake_gpus: 1, idle_release, ..Options::default() });
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));

    // A variable a client may not set is left out and counted.
    let (code, model) = c.post(
        1,
        "/api/kernels",
        serde_json::json!({ "name": "python3", "gpus": 1, "env": { "LD_PRELOAD": "/nonexistent/libx.so" } }),
    );
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    let kernel = model["id"].as_str().expect("kernel id").to_owned();

    // A wrong token is refused and counted.
    match c
        .agent()
        .get(&format!("{}/api/v1/status", c.host(2).url))
        .set("Authorization", "token not-the-token-0123456789")
        .call()
    {
        Err(ureq::Error::Status(401, _)) => {}
        other => panic!("a wrong token: {:?}", other.map(|r| r.status())),
    }

    let ca = c.dir().join("pki/ca.pem");
    let gateway = GatewayClient::new(&c.host(1).url, Some(TOKEN.to_owned()))
        .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("TLS client config"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let (mut tx, mut rx) = gateway.connect_channels(&kernel, false).await.expect("channels WebSocket").split();
        tx.send(WsFrame::Text("{oops".into())).await.expect("send a malformed message");
        let CellOutcome { status, stdout: out, .. } = run_cell_on(&mut tx, &mut rx, GPU_CELL).await;
        assert_eq!((status.as_str(), out.lines().find(|l| l.starts_with("SUM"))), ("ok", Some("SUM 65536.0")), "{out}");
    });
    // The GPU is taken back after `idle_release` and the kernel's memory checkpointed.
    wait_for(Duration::from_secs(30), "a GPU eviction after the GPU cell", || {
        scrape_all(&c).iter().any(|t| t.contains("notebookos_gpu_evictions_total{")).then_some(())
    });
    rt.block_on(async {
        let (mut tx, mut rx) = gateway.connect_channels(&kernel, false).await.expect("channels WebSocket").split();
        // On the same replica the buffer is restored onto the GPU; elsewhere the names are
        // not there (device handles cannot be pickled) and a new buffer is made.
        let cell = "try:\n    print('SUM', dev.sum(buf))\nexcept NameError:\n    exec(CELL)"
            .replace("CELL", &format!("{GPU_CELL:?}"));
        let CellOutcome { status, stdout: out, .. } = run_cell_on(&mut tx, &mut rx, &cell).await;
        assert_eq!((status.as_str(), out.lines().find(|l| l.starts_with("SUM"))), ("ok", Some("SUM 65536.0")), "{out}");
    });
    c
}

// ------------------------------------------------------------------------------ the test

#[test]
fn prometheus_scrapes_every_documented_metric_and_the_rules_and_dashboard_use_real_ones() {
    const TEST: &str = "prometheus_scrapes_every_documented_metric_and_the_rules_and_dashboard_use_real_ones";
    let Some(prometheus_bin) = tool("prometheus", TEST) else { return };
    let started = Instant::now();

    // The table and the code agree on the names.
    let documented = documented_metrics();
    let by_name: BTreeMap<&str, &Documented> = documented.iter().map(|d| (d.name.as_str(), d)).collect();
    let code = registered_in_code();
    for d in &documented {
        assert!(code.contains_key(d.registered()), "{} is documented but not registered in the code", d.name);
    }
    for (name, file) in &code {
        assert!(
            documented.iter().any(|d| d.registered() == name),
            "{name} ({}) is not in the metrics table of docs/operations.md",
            file.display()
        );
    }
    for (name, why) in TRIGGERED {
        assert!(by_name.get(name).is_some_and(|d| d.exported == "event"), "{name} ({why}) is not an event row");
    }

    let mut c = cluster_with_workload();
    let targets: Vec<String> = c
        .hosts
        .iter()
        .map(|h| h.url.strip_prefix("https://").expect("an HTTPS host").trim_end_matches('/').to_owned())
        .collect();
    let all: BTreeSet<String> = targets.iter().cloned().collect();
    let rules_file = root().join("packaging/prometheus/notebookos.rules.yml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules:?}\n\
         scrape_configs:\n  - job_name: notebookosd\n    scheme: https\n    tls_config:\n      ca_file: {ca:?}\n\
         \x20   static_configs:\n      - targets: [{targets}]\n",
        rules = rules_file.display().to_string(),
        ca = c.dir().join("pki/ca.pem").display().to_string(),
        targets = targets.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", "),
    );
    let prom = Prometheus::start(&prometheus_bin, &config);

    // Two scrapes of every host, and the workload's families scraped.
    let series_of = |prom: &Prometheus| -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
        let data = prom.api("series", &[("match[]", "{__name__=~\"notebookos_.+\"}")]);
        let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
        for s in data.as_array().expect("series list") {
            let labels: BTreeMap<String, String> = serde_json::from_value(s.clone()).expect("label set");
            let name = labels.get("__name__").cloned().unwrap_or_default();
            out.entry(name).or_default().push(labels);
        }
        out
    };
    let series = wait_for(Duration::from_secs(30), "two scrapes of each host with the workload's series", || {
        let scrapes = prom.query("count_over_time(up{job=\"notebookosd\"}[1m]) >= 2");
        let up = prom.query("up{job=\"notebookosd\"} == 1");
        let series = series_of(&prom);
        (scrapes.len() == 3 && up.len() == 3 && TRIGGERED.iter().all(|(n, _)| series.contains_key(*n)))
            .then_some(series)
    });

    // Every documented metric with its labels, on every host where it is always exported.
    eprintln!("metrics scraped by Prometheus (instances of {}):", all.len());
    for d in &documented {
        let mut seen = BTreeSet::new();
        for name in d.series() {
            for labels in series.get(&name).map(Vec::as_slice).unwrap_or_default() {
                let own: BTreeSet<String> = labels
                    .keys()
                    .filter(|k| *k != "__name__" && !TARGET_LABELS.contains(&k.as_str()))
                    .filter(|k| !(name.ends_with("_bucket") && *k == "le"))
                    .cloned()
                    .collect();
                assert_eq!(own, d.labels, "labels of {name}: {labels:?} (documented {:?})", d.labels);
                assert_eq!(labels.get("job").map(String::as_str), Some("notebookosd"), "{labels:?}");
                seen.insert(labels.get("instance").cloned().unwrap_or_default());
            }
        }
        match d.exported.as_str() {
            // This cluster has GPUs (simulated), is a cluster and keeps a pre-warm pool.
            "always" | "GPUs" | "cluster" | "pool" => {
                assert_eq!(seen, all, "{} ({}) is not scraped from every host", d.name, d.exported);
            }
            "event" if TRIGGERED.iter().any(|(n, _)| *n == d.name) => {
                assert!(!seen.is_empty(), "{} is not scraped", d.name);
            }
            _ => {}
        }
        if !seen.is_empty() {
            eprintln!("  {:<48} {:<9} {}/{} {:?}", d.name, d.kind, seen.len(), all.len(), d.labels);
        }
    }
    for name in series.keys() {
        assert!(
            documented.iter().any(|d| d.series().contains(name)),
            "{name} is scraped but not in the metrics table of docs/operations.md"
        );
    }

    // Every rule evaluates without error; alerts carry what an operator needs.
    let rules = wait_for(Duration::from_secs(20), "every rule evaluated", || {
        let data = prom.api("rules", &[]);
        let rules: Vec<Value> = data["groups"]
            .as_array()
            .expect("rule groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        rules.iter().all(|r| r["health"] == "ok").then_some(rules)
    });
    let records: BTreeSet<String> = rules
        .iter()
        .filter(|r| r["type"] == "recording")
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect();
    let mut expressions: Vec<(String, String)> = Vec::new();
    for r in &rules {
        let name = r["name"].as_str().expect("rule name");
        assert!(r["lastError"].as_str().unwrap_or("").is_empty(), "{name}: {r}");
        expressions.push((format!("rule {name}"), r["query"].as_str().expect("rule query").to_owned()));
        if r["type"] == "alerting" {
            assert!(r["duration"].as_f64().unwrap_or(0.0) > 0.0, "{name} has no `for`: {r}");
            assert!(["critical", "warning"].contains(&r["labels"]["severity"].as_str().unwrap_or("")), "{name}: {r}");
            for a in ["summary", "description"] {
                assert!(r["annotations"][a].as_str().is_some_and(|s| s.len() > 20), "{name}: no {a}: {r}");
            }
        }
    }
    assert!(records.len() >= 5, "recording rules: {records:?}");
    // Per host (`instance:`) rules record a series for each host, cluster rules one; the
    // rate-based ones once an evaluation came after a host's second scrape.
    for record in &records {
        let wanted = if record.starts_with("instance:") { all.clone() } else { BTreeSet::from([String::new()]) };
        let mut last = Vec::new();
        let recorded = wait_for(Duration::from_secs(15), &format!("{record} recorded for {wanted:?}"), || {
            last = prom.query(record);
            let instances: BTreeSet<String> =
                last.iter().map(|s| s["metric"]["instance"].as_str().unwrap_or("").to_owned()).collect();
            (instances == wanted && last.len() == wanted.len()).then_some(last.clone())
        });
        assert!(!recorded.is_empty(), "{record}: {last:?}");
    }
    // One one-GPU kernel with a replica on each one-GPU host: each host's kernels request 1 GPU.
    let requested = prom.query("instance:notebookos_gpus_requested:current");
    assert!(requested.iter().all(|s| sample_value(s) == 1.0), "{requested:?}");

    // The dashboard.
    let dashboard_path = root().join("packaging/grafana/notebookos.json");
    let dashboard: Value = serde_json::from_str(&read(&dashboard_path)).expect("dashboard JSON");
    assert!(dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36, "schemaVersion: {}", dashboard["schemaVersion"]);
    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    assert!(
        variables.iter().any(|v| v["type"] == "datasource" && v["name"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus `datasource` variable: {variables:?}"
    );
    let host_var = variables
        .iter()
        .find(|v| v["type"] == "query" && (v["name"] == "instance" || v["name"] == "host"))
        .expect("an instance/host variable");
    assert_eq!(host_var["datasource"]["uid"], "${datasource}", "{host_var}");
    let host_query = host_var["query"]["query"].as_str().or(host_var["query"].as_str()).expect("variable query");
    // `label_values(M, L)` lists the values of L on M: `count by (L) (M)` in PromQL.
    let (metric, label) = host_query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .and_then(|q| q.rsplit_once(','))
        .unwrap_or_else(|| panic!("the host variable's query is not label_values(M, L): {host_query}"));
    let hosts_query = format!("count by ({}) ({})", label.trim(), metric.trim());
    let listed = prom.query(&hosts_query);
    assert_eq!(listed.len(), all.len(), "the host variable ({hosts_query}) lists {listed:?}");
    expressions.push(("variable instance".to_owned(), hosts_query));
    let mut ids = BTreeSet::new();
    let mut panels = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate panel id: {p}");
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().expect("panel title").to_owned();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title}");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty()).expect("panel targets");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {title}");
            let expr = t["expr"].as_str().filter(|e| !e.trim().is_empty()).expect("target expr");
            expressions.push((format!("panel {title:?}"), substitute(expr)));
            panels.push((title.clone(), expr.to_owned()));
        }
    }

    // Every metric and label the rules and the dashboard use is on the daemons' /metrics.
    let mut exposed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for text in scrape_all(&c) {
        exposition_labels(&text, &mut exposed);
    }
    let recorded = prom.api("series", &[("match[]", "{__name__=~\".+:.+\"}")]);
    for s in recorded.as_array().expect("recorded series") {
        let labels: BTreeMap<String, String> = serde_json::from_value(s.clone()).expect("label set");
        let name = labels.get("__name__").cloned().unwrap_or_default();
        exposed.entry(name).or_default().extend(labels.into_keys().filter(|k| k != "__name__"));
    }
    let mut used = BTreeSet::new();
    for (source, expr) in &expressions {
        let uses = promql_uses(expr);
        assert!(!uses.selectors.is_empty(), "{source}: no series in {expr:?}");
        let mut available: BTreeSet<String> = TARGET_LABELS.iter().map(|l| (*l).to_owned()).collect();
        for (name, matchers) in &uses.selectors {
            if name.starts_with("notebookos_") {
                let labels = exposed
                    .get(name)
                    .unwrap_or_else(|| panic!("{source}: {name} is not on the daemons' /metrics ({expr})"));
                available.extend(labels.iter().cloned());
                for m in matchers {
                    assert!(
                        labels.contains(m) || TARGET_LABELS.contains(&m.as_str()),
                        "{source}: {name} has no label {m} ({expr}; it has {labels:?})"
                    );
                }
                used.insert(name.clone());
            } else if name.contains(':') {
                assert!(records.contains(name), "{source}: {name} is not a recording rule ({expr})");
                let labels = exposed.get(name).unwrap_or_else(|| panic!("{source}: {name} was never recorded"));
                available.extend(labels.iter().cloned());
                for m in matchers {
                    assert!(labels.contains(m), "{source}: {name} has no label {m} ({expr}; it has {labels:?})");
                }
            } else {
                assert_eq!(name, "up", "{source}: unknown series {name} in {expr}");
                for m in matchers {
                    assert!(TARGET_LABELS.contains(&m.as_str()), "{source}: up has no label {m}");
                }
            }
        }
        for label in &uses.grouping {
            assert!(available.contains(label), "{source}: grouping by {label}, which none of its series has ({expr})");
        }
    }
    for name in DASHBOARD_MUST_USE {
        assert!(
            panels.iter().any(|(_, e)| promql_uses(&substitute(e)).selectors.iter().any(|(n, _)| n == name)),
            "no dashboard panel charts {name}"
        );
    }

    // Every dashboard query runs and returns data.
    eprintln!("dashboard panels:");
    for (title, expr) in &panels {
        let result = prom.query(&substitute(expr));
        assert!(!result.is_empty(), "panel {title:?}: no data for {expr}");
        eprintln!("  {title}: {expr} -> {} series", result.len());
    }
    eprintln!("metrics used by the rules and the dashboard: {used:?}");

    // A host that dies: NotebookOSHostDown goes pending for it, and only for it.
    let dead = targets[2].clone();
    c.kill(3);
    let pending = wait_for(Duration::from_secs(30), "NotebookOSHostDown pending for the killed host", || {
        let alerts = prom.api("alerts", &[]);
        let down: Vec<Value> = alerts["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .filter(|a| a["labels"]["alertname"] == "NotebookOSHostDown")
            .cloned()
            .collect();
        (!down.is_empty()).then_some(down)
    });
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["labels"]["instance"].as_str(), Some(dead.as_str()), "{pending:?}");
    assert_eq!(pending[0]["state"], "pending", "{pending:?}");
    drop(prom);
    eprintln!("{TEST}: {:.1} s", started.elapsed().as_secs_f64());
}
