//! One policy, two drivers: every scheduler-core decision the simulated `notebookos`
//! makes is one that `notebookosd` makes too. The simulator records the decisions it
//! called (`module::function`); each must be called in the daemon's sources.

use std::path::{Path, PathBuf};

use nbos_sched::sim::synthetic::{self, SyntheticParams};
use nbos_sched::sim::{Model, PolicyKind};

/// Every path of the policy: placement, executor choice, a move when all replicas
/// yield, scale out and in, drain (whose replicas are re-placed), pre-warm sizing, the
/// fair-share order of waiting cells.
const EVERY_PATH: [&str; 8] = [
    "autoscaler::Decider::decide",
    "drain::choose",
    "fairshare::order",
    "migrate::choose_with_memory",
    "placement::place_with_memory",
    "placement::replace_with_memory",
    "preselect::preselect",
    "prewarm::pool_size",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Whether `text` calls `function` (not as part of a longer name, not its definition).
fn calls(text: &str, function: &str) -> bool {
    let call = format!("{function}(");
    text.match_indices(&call).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && !text[..i].ends_with("fn ")
    })
}

/// Whether `text` imports `function` from `nbos_sched::<module>` by name (alone or in a
/// `use` group).
fn imports(text: &str, module: &str, function: &str) -> bool {
    let path = format!("nbos_sched::{module}::");
    text.match_indices(&path).any(|(i, _)| {
        let rest = &text[i + path.len()..];
        let item = rest.split(';').next().unwrap_or("");
        item.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == function)
    })
}

/// The daemon's source files that call the decision `module::[Type::]function`: as
/// `module::function(` with the module imported from `nbos_sched`, or bare after importing
/// the function itself; a method: the type imported from `nbos_sched::<module>` and
/// `.function(` or `Type::function(` called.
fn daemon_callers(files: &[(PathBuf, String)], decision: &str) -> Vec<PathBuf> {
    let parts: Vec<&str> = decision.split("::").collect();
    let (module, function, types) = (parts[0], parts[parts.len() - 1], &parts[1..parts.len() - 1]);
    files
        .iter()
        .filter(|(_, text)| match types {
            [] => {
                (text.contains(&format!("nbos_sched::{module}")) && calls(text, &format!("{module}::{function}")))
                    || (imports(text, module, function) && calls(text, function))
            }
            types => types.iter().all(|t| {
                imports(text, module, t)
                    && (text.contains(&format!(".{function}(")) || text.contains(&format!("{t}::{function}(")))
            }),
        })
        .map(|(p, _)| p.clone())
        .collect()
}

fn daemon_sources() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    assert!(paths.len() > 50, "daemon/src not found at {}", src.display());
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

#[test]
fn every_decision_of_the_simulated_notebookos_is_one_the_daemon_calls() {
    // Small hosts and a busy afternoon: cells find their replicas' hosts full (moves),
    // the cluster grows and, as sessions end, shrinks (drains).
    let w = synthetic::generate(&SyntheticParams { sessions: 300, hours: 6.0, ..SyntheticParams::default() }, 7);
    let model = Model::default();
    let r = nbos_sched::sim::run(&w, PolicyKind::Notebookos, &model).expect("the simulation runs");
    assert!(r.migrations > 0 && r.scale_outs > 0 && r.scale_ins > 0, "the workload exercises moves and scaling: {r:?}");
    let files = daemon_sources();
    let missing: Vec<&str> = r.decisions.iter().copied().filter(|d| daemon_callers(&files, d).is_empty()).collect();
    assert!(missing.is_empty(), "the simulated notebookos calls decisions notebookosd does not: {missing:?}");
    assert_eq!(r.decisions, EVERY_PATH, "the workload exercises every decision (or a new one needs a path here)");
}

#[test]
fn the_fair_shares_headroom_is_one_the_daemon_calls_too() {
    // Off by default (so not in EVERY_PATH); on, the simulator keeps it as the daemon does.
    let mut w = synthetic::generate(&SyntheticParams { sessions: 100, hours: 2.0, ..SyntheticParams::default() }, 7);
    nbos_sched::sim::users::assign(&mut w, 5, 7);
    let mut model = Model::default();
    model.notebookos.fair_share_headroom = true;
    let r = nbos_sched::sim::run(&w, PolicyKind::Notebookos, &model).expect("the simulation runs");
    assert!(r.decisions.contains(&"fairshare::headroom"), "{:?}", r.decisions);
    let files = daemon_sources();
    assert!(!daemon_callers(&files, "fairshare::headroom").is_empty(), "notebookosd keeps no headroom");
}

#[test]
fn the_scan_finds_calls_and_only_calls() {
    let files = vec![
        (PathBuf::from("a.rs"), "use nbos_sched::drain;\nlet x = drain::choose(&c, 2);\n".to_owned()),
        (PathBuf::from("b.rs"), "use nbos_sched::executor;\nfn choose(x: u32) {}\nlet y = rechoose(1);\n".to_owned()),
        (PathBuf::from("c.rs"), "use nbos_sched::autoscaler::{Decider};\nd.decide(now, &c, r);\n".to_owned()),
        // The module imported, but the `choose` called is another one.
        (PathBuf::from("d.rs"), "use nbos_sched::migrate;\nuse other::choose;\nlet z = choose(1);\n".to_owned()),
        (
            PathBuf::from("e.rs"),
            "use nbos_sched::prewarm::{self, pool_size};\nlet n = pool_size(1, 2, 3, 4, 5);\n".to_owned(),
        ),
    ];
    assert!(daemon_callers(&files, "migrate::choose").is_empty(), "another crate's choose is no call of the decision");
    assert_eq!(daemon_callers(&files, "prewarm::pool_size"), vec![PathBuf::from("e.rs")]);
    assert_eq!(daemon_callers(&files, "drain::choose"), vec![PathBuf::from("a.rs")]);
    assert!(daemon_callers(&files, "executor::choose").is_empty(), "a definition or a longer name is no call");
    assert_eq!(daemon_callers(&files, "autoscaler::Decider::decide"), vec![PathBuf::from("c.rs")]);
    assert!(daemon_callers(&files, "autoscaler::Other::decide").is_empty());
}
