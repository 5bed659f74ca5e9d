//! What `nbos sim` prints and writes: the terminal table, the `--json` document, and the
//! markdown report with its plots (the CLI writes the files).

use std::fmt::Write as _;

use super::metrics::PolicyResult;
use super::svg::{Chart, Scale, Series};
use super::workload::Stats;
use super::Model;

/// The terminal table, one row per policy.
pub fn table(results: &[(&str, PolicyResult)]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<17} {:>11} {:>10} {:>10} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>6} {:>7} {:>8} {:>6} {:>6} {:>11}",
        "policy",
        "GPU-h prov",
        "GPU-h bound",
        "floor",
        "p50 s",
        "p95 s",
        "p99 s",
        "max s",
        ">1s",
        ">10s",
        "migr",
        "bg mv",
        "move s",
        "outs",
        "ins",
        "hosts mean/pk"
    );
    for (name, r) in results {
        let _ = writeln!(
            o,
            "{:<17} {:>11.1} {:>10.1} {:>10.1} {:>8.3} {:>8.3} {:>8.3} {:>9.1} {:>6} {:>6} {:>6} {:>7} {:>8.0} {:>6} {:>6} {:>7.1}/{:<4}",
            name,
            r.gpu_hours_provisioned,
            r.gpu_hours_bound,
            r.floor_gpu_hours,
            r.delay_p50_s,
            r.delay_p95_s,
            r.delay_p99_s,
            r.delay_max_s,
            r.delayed_over_1s,
            r.delayed_over_10s,
            r.migrations,
            r.background_moves,
            r.migration_seconds,
            r.scale_outs,
            r.scale_ins,
            r.hosts_mean,
            r.hosts_peak
        );
    }
    let with_users: Vec<_> = results.iter().filter_map(|(n, r)| r.users.as_ref().map(|u| (n, u))).collect();
    if !with_users.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<17} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}",
            "per user",
            "users",
            "others p95 s",
            "others p99 s",
            "worst p99 s",
            "median p99 s",
            "flood p99 s",
            "Jain",
            "Jain oth"
        );
        for (name, u) in with_users {
            let _ = writeln!(
                o,
                "{:<17} {:>6} {:>12.3} {:>12.3} {:>12.3} {:>12.3} {:>12} {:>9.3} {:>9.3}",
                name,
                u.users,
                u.others_delay_p95_s,
                u.others_delay_p99_s,
                u.worst_user_delay_p99_s,
                u.median_user_delay_p99_s,
                u.flood_delay_p99_s.map_or_else(|| "-".to_owned(), |x| format!("{x:.3}")),
                u.jain_gpu_time,
                u.jain_gpu_time_others
            );
        }
    }
    o
}

/// The `--json` document: `{"workload", "wall_s", "model", "policies": {NAME: {...}}}`.
/// `wall_s` is `None` in the copy written to `--out` (files are byte-identical per seed).
pub fn json(
    workload: &str,
    stats: &Stats,
    model: &Model,
    results: &[(&str, PolicyResult)],
    wall_s: Option<f64>,
) -> serde_json::Value {
    let mut policies = serde_json::Map::new();
    for (name, r) in results {
        policies.insert((*name).to_owned(), serde_json::to_value(r).unwrap_or(serde_json::Value::Null));
    }
    let mut doc = serde_json::Map::new();
    doc.insert("workload".into(), serde_json::json!({ "name": workload, "stats": stats }));
    if let Some(w) = wall_s {
        doc.insert("wall_s".into(), serde_json::json!(w));
    }
    doc.insert("model".into(), serde_json::to_value(model).unwrap_or(serde_json::Value::Null));
    doc.insert("policies".into(), serde_json::Value::Object(policies));
    serde_json::Value::Object(doc)
}

/// The plots: file name and SVG text.
pub fn plots(results: &[(&str, PolicyResult)]) -> Vec<(&'static str, String)> {
    let hours = |t: u64| t as f64 / 3_600_000.0;
    let over_time = |title: &'static str, y: &'static str, f: fn(&super::metrics::Point) -> u32| Chart {
        title,
        x_label: "hours",
        y_label: y,
        x_scale: Scale::Linear,
        series: results
            .iter()
            .map(|(n, r)| Series {
                name: (*n).to_owned(),
                points: r.series.iter().map(|p| (hours(p.t_ms), f64::from(f(p)))).collect(),
            })
            .collect(),
    };
    let cdf = Chart {
        title: "Interactivity delay (submission to execution), CDF",
        x_label: "seconds (log scale)",
        y_label: "fraction of trainings",
        x_scale: Scale::Log10,
        series: results
            .iter()
            .map(|(n, r)| {
                let d = &r.delays_ms;
                let steps = 400usize.min(d.len().max(1));
                let points = (0..=steps)
                    .filter_map(|i| {
                        if d.is_empty() {
                            return None;
                        }
                        let k = (i * (d.len() - 1)) / steps;
                        Some(((d[k] as f64 / 1000.0).max(0.001), (k + 1) as f64 / d.len() as f64))
                    })
                    .collect();
                Series { name: (*n).to_owned(), points }
            })
            .collect(),
    };
    vec![
        ("hosts.svg", over_time("Hosts provisioned over time", "hosts", |p| p.hosts).render()),
        ("gpus_bound.svg", over_time("GPUs bound over time", "GPUs bound", |p| p.gpus_bound).render()),
        ("delay_cdf.svg", cdf.render()),
    ]
}

/// The markdown report that embeds the plots.
pub fn markdown(workload: &str, stats: &Stats, model: &Model, results: &[(&str, PolicyResult)]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# nbos sim: {workload}\n");
    let _ = writeln!(
        o,
        "{} sessions, {} trainings ({:.2} per session), {:.1} h of submissions; floor {:.1} GPU-hours. \
         Hosts of {} GPUs, provisioned in {} ± {} s, at least {} up; seed {}. \
         Moves cost a replica start ({:.0} ms cold, {:.0} ms pre-warmed) plus the state transfer \
         ({:.0} ms + {:.1} ms/MiB of namespace), at most {} at once per host (docs/sim/costs.json).\n",
        stats.sessions,
        stats.trainings,
        stats.trainings_per_session,
        stats.span_hours,
        stats.floor_gpu_hours,
        model.gpus_per_host,
        model.provision_ms / 1000,
        model.provision_jitter_ms / 1000,
        model.min_hosts(),
        model.seed,
        model.costs.replica_start.cold_ms,
        model.costs.replica_start.prewarmed_ms,
        model.costs.transfer_ms(0),
        model.costs.state_transfer.per_mib_ms,
        model.costs.max_moves_per_host
    );
    let _ = writeln!(
        o,
        "| policy | GPU-h provisioned | GPU-h bound | bound ÷ floor | delay p50 s | p95 s | p99 s | max s | >1 s | >10 s | migrations | background moves | move s | scale-outs | scale-ins |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, r) in results {
        let ratio = if r.floor_gpu_hours > 0.0 { r.gpu_hours_bound / r.floor_gpu_hours } else { 0.0 };
        let _ = writeln!(
            o,
            "| {name} | {:.1} | {:.1} | {ratio:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {} | {} | {} | {} | {:.0} | {} | {} |",
            r.gpu_hours_provisioned,
            r.gpu_hours_bound,
            r.delay_p50_s,
            r.delay_p95_s,
            r.delay_p99_s,
            r.delay_max_s,
            r.delayed_over_1s,
            r.delayed_over_10s,
            r.migrations,
            r.background_moves,
            r.migration_seconds,
            r.scale_outs,
            r.scale_ins
        );
    }
    o.push_str("\n![hosts](hosts.svg)\n\n![GPUs bound](gpus_bound.svg)\n\n![delay CDF](delay_cdf.svg)\n");
    o
}
