//! How much a figure moves: across seeds (`--seeds N`: the mean and its 95% confidence
//! interval, Student's t on the N per-seed values) and across windows (`--each-window`:
//! min, median, max).

use super::metrics::{round3, PolicyResult};

/// A mean with its 95% confidence interval; no interval from a single value.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Interval {
    /// The mean of the values.
    pub mean: f64,
    /// Lower end of the 95% interval (`None` for one value).
    pub lo: Option<f64>,
    /// Upper end.
    pub hi: Option<f64>,
}

impl Interval {
    /// Half the interval's width (0 without one).
    pub fn half_width(&self) -> f64 {
        match (self.lo, self.hi) {
            (Some(lo), Some(hi)) => (hi - lo) / 2.0,
            _ => 0.0,
        }
    }
}

/// Student's t, two-sided 95% (the 0.975 quantile), for `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    // Exact to 4 decimals up to 30; above, the Cornish-Fisher expansion in 1/df around the
    // normal quantile is within 1e-4.
    const TABLE: [f64; 30] = [
        12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
        2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518,
        2.0484, 2.0452, 2.0423,
    ];
    if let Some(t) = df.checked_sub(1).and_then(|i| TABLE.get(i)) {
        return *t;
    }
    #[expect(clippy::cast_precision_loss, reason = "degrees of freedom")]
    let v = df.max(1) as f64;
    let z: f64 = 1.959_964;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * v)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v * v * v)
}

/// The mean of `xs` and its 95% interval, `mean ± t975(n-1) × s / √n` with `s` the sample
/// standard deviation: the seeds are independent replications, so their means are
/// (nearly) normal and the interval says where the model's figure lies, not the spread of
/// single runs. `None` for no values.
pub fn mean_ci95(xs: &[f64]) -> Option<Interval> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    #[expect(clippy::cast_precision_loss, reason = "a count of seeds")]
    let nf = n as f64;
    let mean = xs.iter().sum::<f64>() / nf;
    if n == 1 {
        return Some(Interval { mean, lo: None, hi: None });
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (nf - 1.0);
    let half = t975(n - 1) * (var / nf).sqrt();
    Some(Interval { mean, lo: Some(mean - half), hi: Some(mean + half) })
}

/// The figures of a policy's JSON that are numbers, by key (what `--seeds` summarises).
pub fn figures(r: &PolicyResult) -> Vec<(String, f64)> {
    match serde_json::to_value(r) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().filter_map(|(k, v)| v.as_f64().map(|x| (k, x))).collect(),
        _ => Vec::new(),
    }
}

/// `--seeds`: for each policy (in the order of the first run) and each of its numeric
/// figures, the mean and 95% interval over the runs, rounded to 3 decimals:
/// `{POLICY: {FIGURE: {"mean", "lo", "hi"}}, "n": N}` (figures include `saved_gpu_hours`
/// against reservation when it ran). `runs` holds one result list per seed.
pub fn across_seeds(runs: &[Vec<(&str, PolicyResult)>]) -> serde_json::Value {
    let mut doc = serde_json::Map::new();
    for (name, _) in runs.first().map(Vec::as_slice).unwrap_or_default() {
        let mut per_figure = serde_json::Map::new();
        for (key, xs) in collect(runs, name) {
            if let Some(i) = mean_ci95(&xs) {
                let r = |x: Option<f64>| x.map(round3);
                let v = serde_json::json!({ "mean": round3(i.mean), "lo": r(i.lo), "hi": r(i.hi) });
                per_figure.insert(key, v);
            }
        }
        doc.insert((*name).to_owned(), serde_json::Value::Object(per_figure));
    }
    doc.insert("n".into(), serde_json::json!(runs.len()));
    serde_json::Value::Object(doc)
}

/// The terminal table of [`across_seeds`]: per policy, mean ± half-width of the main figures.
pub fn seeds_table(summary: &serde_json::Value, policies: &[&str]) -> String {
    use std::fmt::Write as _;
    const FIGURES: [(&str, &str); 8] = [
        ("gpu_hours_provisioned", "GPU-h prov"),
        ("saved_gpu_hours", "saved vs reservation"),
        ("gpu_hours_bound", "GPU-h bound"),
        ("delay_p50_s", "p50 s"),
        ("delay_p95_s", "p95 s"),
        ("delay_p99_s", "p99 s"),
        ("migrations", "migr"),
        ("sim_hours", "sim h"),
    ];
    let mut o = format!("{:<17}", "policy");
    for (_, head) in FIGURES {
        let _ = write!(o, " {head:>21}");
    }
    o.push('\n');
    for p in policies {
        let _ = write!(o, "{p:<17}");
        for (key, _) in FIGURES {
            let f = &summary[*p][key];
            let cell = match (f["mean"].as_f64(), f["lo"].as_f64(), f["hi"].as_f64()) {
                (Some(m), Some(lo), Some(hi)) => format!("{m:.3} ± {:.3}", (hi - lo) / 2.0),
                (Some(m), _, _) => format!("{m:.3}"),
                _ => "-".to_owned(),
            };
            let _ = write!(o, " {cell:>21}");
        }
        o.push('\n');
    }
    o
}

/// Per figure of `policy`, its value in every run. With reservation in the runs, a policy
/// also gets `saved_gpu_hours`: reservation's GPU-hours provisioned minus its own, per seed
/// (paired: both ran on the same sessions, so the interval is the saving's own).
fn collect(runs: &[Vec<(&str, PolicyResult)>], policy: &str) -> Vec<(String, Vec<f64>)> {
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    for run in runs {
        let Some((_, r)) = run.iter().find(|(n, _)| *n == policy) else { continue };
        let reservation = run.iter().find(|(n, _)| *n == "reservation" && policy != "reservation");
        let saved = reservation
            .map(|(_, res)| ("saved_gpu_hours".to_owned(), res.gpu_hours_provisioned - r.gpu_hours_provisioned));
        for (key, x) in figures(r).into_iter().chain(saved) {
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, xs)) => xs.push(x),
                None => out.push((key, vec![x])),
            }
        }
    }
    out
}

/// Min, median and max of values (the spread across windows).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

/// The spread of `xs`; `None` for none.
pub fn spread(xs: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some(Spread { min: round3(v[0]), median: round3(median), max: round3(v[n - 1]) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_table_and_the_normal_limit() {
        assert!((t975(1) - 12.706).abs() < 1e-3);
        assert!((t975(9) - 2.262).abs() < 1e-3);
        // The expansion continues the table smoothly and tends to the normal quantile.
        assert!((t975(31) - 2.0395).abs() < 2e-4, "{}", t975(31));
        assert!((t975(60) - 2.0003).abs() < 2e-4, "{}", t975(60));
        assert!((t975(100_000) - 1.96).abs() < 1e-3);
    }

    #[test]
    fn the_interval_is_mean_plus_minus_t_times_the_standard_error() {
        // Mean 5, sample sd √2.5, n 5: half-width 2.7764 × √(2.5/5) = 1.9632.
        let i = mean_ci95(&[3.0, 4.0, 5.0, 6.0, 7.0]).expect("values");
        assert!((i.mean - 5.0).abs() < 1e-12);
        assert!((i.half_width() - 1.9632).abs() < 1e-4, "{i:?}");
        assert!(i.lo.is_some_and(|lo| lo < i.mean) && i.hi.is_some_and(|hi| hi > i.mean));
        let same = mean_ci95(&[2.0, 2.0, 2.0]).expect("values");
        assert_eq!((same.lo, same.hi), (Some(2.0), Some(2.0)), "no spread, no width");
        assert_eq!(mean_ci95(&[4.0]), Some(Interval { mean: 4.0, lo: None, hi: None }));
        assert_eq!(mean_ci95(&[]), None);
    }

    #[test]
    fn across_seeds_summarises_every_numeric_figure_per_policy() {
        let run = |gpu_h: f64| {
            let mut r = PolicyResult::new(None, super::super::metrics::Totals::default(), Vec::new(), Vec::new());
            r.gpu_hours_provisioned = gpu_h;
            vec![("notebookos", r)]
        };
        let doc = across_seeds(&[run(10.0), run(20.0)]);
        assert_eq!(doc["n"], 2);
        assert!(doc["notebookos"].get("saved_gpu_hours").is_none(), "no reservation, no saving");
        let g = &doc["notebookos"]["gpu_hours_provisioned"];
        // sd √50 over √2 seeds: standard error 5, t(1) 12.7062.
        assert_eq!((g["mean"].as_f64(), g["lo"].as_f64(), g["hi"].as_f64()), (Some(15.0), Some(-48.531), Some(78.531)));
        assert_eq!(doc["notebookos"]["violations"]["lo"], 0.0, "integer figures too");
    }

    #[test]
    fn the_saving_against_reservation_is_paired_per_seed() {
        let pair = |res: f64, ours: f64| {
            let r = |gpu_h| {
                let mut r = PolicyResult::new(None, super::super::metrics::Totals::default(), Vec::new(), Vec::new());
                r.gpu_hours_provisioned = gpu_h;
                r
            };
            vec![("reservation", r(res)), ("notebookos", r(ours))]
        };
        // Both policies vary a lot between seeds, their difference not at all.
        let doc = across_seeds(&[pair(100.0, 60.0), pair(200.0, 160.0), pair(150.0, 110.0)]);
        let s = &doc["notebookos"]["saved_gpu_hours"];
        assert_eq!((s["mean"].as_f64(), s["lo"].as_f64(), s["hi"].as_f64()), (Some(40.0), Some(40.0), Some(40.0)));
        assert!(doc["reservation"].get("saved_gpu_hours").is_none());
    }

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some(Spread { min: 1.0, median: 2.0, max: 3.0 }));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]).map(|s| s.median), Some(2.5));
        assert_eq!(spread(&[]), None);
    }
}
