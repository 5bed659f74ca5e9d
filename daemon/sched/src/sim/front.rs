//! The evidence behind the shipped defaults: a sweep's points (one simulated policy
//! configuration each), their cost–delay front, the choice of the point that meets the
//! targets, and the plot. Pure; `nbos sim --sweep` runs the simulations and writes files.
//!
//! The choice is mechanical so that it cannot be tuned by eye: among our policy's points
//! that meet every target (GPU-hours at most `max_cost_ratio` × reservation's, delay p95
//! at most `max_p95_s`, p99 below the paper policy's), the cheapest; ties to the lower
//! p99, then the earlier point. When no point meets them all, [`fallback`]: among the
//! points that meet the cost and p99 targets, the one with the lowest p95 (the target
//! missed, missed by the least), and the report says by how much.

use serde::Serialize;

use super::svg::{Chart, Scale, Series};

/// One simulated configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    /// The policy (`notebookos`, `reservation`, …).
    pub policy: String,
    /// What was varied, e.g. `ratio=7 spare=1 window=10m rule=notebookos` (empty for a baseline).
    pub label: String,
    /// GPU-hours provisioned (mean over seeds).
    pub gpu_hours: f64,
    /// Delay p95, seconds (mean over seeds).
    pub p95_s: f64,
    /// Delay p99, seconds (mean over seeds).
    pub p99_s: f64,
}

/// What the shipped defaults must meet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Targets {
    /// GPU-hours provisioned at most this × reservation's.
    pub max_cost_ratio: f64,
    /// Delay p95 at most this, seconds.
    pub max_p95_s: f64,
}

impl Default for Targets {
    /// Issue 34's: ≤ 0.75 × reservation, p95 ≤ 1 s (and p99 below the paper policy's).
    fn default() -> Self {
        Self { max_cost_ratio: 0.75, max_p95_s: 1.0 }
    }
}

/// Whether `p` meets the targets against reservation's GPU-hours and the paper's p99.
pub fn meets(p: &SweepPoint, t: &Targets, reservation_gpu_hours: f64, paper_p99_s: f64) -> bool {
    p.gpu_hours <= t.max_cost_ratio * reservation_gpu_hours && p.p95_s <= t.max_p95_s && p.p99_s < paper_p99_s
}

/// The index of the point to ship, if any meets the targets.
pub fn choose(points: &[SweepPoint], t: &Targets, reservation_gpu_hours: f64, paper_p99_s: f64) -> Option<usize> {
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| meets(p, t, reservation_gpu_hours, paper_p99_s))
        .min_by(|(i, a), (j, b)| a.gpu_hours.total_cmp(&b.gpu_hours).then(a.p99_s.total_cmp(&b.p99_s)).then(i.cmp(j)))
        .map(|(i, _)| i)
}

/// The point to ship when none meets every target: among those within the cost and p99
/// targets, the lowest p95; ties to the cheaper, then the earlier. `None`: none is even
/// within those.
pub fn fallback(points: &[SweepPoint], t: &Targets, reservation_gpu_hours: f64, paper_p99_s: f64) -> Option<usize> {
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.gpu_hours <= t.max_cost_ratio * reservation_gpu_hours && p.p99_s < paper_p99_s)
        .min_by(|(i, a), (j, b)| a.p95_s.total_cmp(&b.p95_s).then(a.gpu_hours.total_cmp(&b.gpu_hours)).then(i.cmp(j)))
        .map(|(i, _)| i)
}

/// The points no other point beats on both cost and `delay` (lower is better in both),
/// in order of delay: the front a choice should come from.
pub fn front(points: &[SweepPoint], delay: impl Fn(&SweepPoint) -> f64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..points.len()).collect();
    idx.sort_by(|&a, &b| {
        delay(&points[a]).total_cmp(&delay(&points[b])).then(points[a].gpu_hours.total_cmp(&points[b].gpu_hours))
    });
    let mut out = Vec::new();
    let mut best = f64::INFINITY;
    for i in idx {
        if points[i].gpu_hours < best {
            best = points[i].gpu_hours;
            out.push(i);
        }
    }
    out
}

/// Cost against delay (p95 or p99, log scale): every policy's points as dots, our
/// policy's front as a line, the chosen point as its own dot.
pub fn plot(title: &str, points: &[SweepPoint], ours: &str, chosen: Option<usize>, p99: bool) -> String {
    let delay = |p: &SweepPoint| if p99 { p.p99_s } else { p.p95_s };
    // Log scale: a zero delay is drawn at the lowest decade.
    let xy = |p: &SweepPoint| (delay(p).max(0.001), p.gpu_hours);
    let mine: Vec<SweepPoint> = points.iter().filter(|p| p.policy == ours).cloned().collect();
    let line =
        Series { name: format!("{ours}: front"), points: front(&mine, delay).iter().map(|&i| xy(&mine[i])).collect() };
    let mut names: Vec<&str> = Vec::new();
    for p in points {
        if !names.contains(&p.policy.as_str()) {
            names.push(&p.policy);
        }
    }
    let mut dots: Vec<Series> = names
        .iter()
        .map(|n| Series { name: (*n).to_owned(), points: points.iter().filter(|p| p.policy == *n).map(xy).collect() })
        .collect();
    if let Some(c) = chosen.and_then(|i| points.get(i)) {
        dots.push(Series { name: format!("shipped: {}", c.label), points: vec![xy(c)] });
    }
    let chart = Chart {
        title,
        x_label: if p99 { "delay p99, s (log)" } else { "delay p95, s (log)" },
        y_label: "GPU-hours provisioned",
        x_scale: Scale::Log10,
        series: vec![line],
    };
    chart.render_with_dots(&dots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(policy: &str, label: &str, gpu_hours: f64, p95_s: f64, p99_s: f64) -> SweepPoint {
        SweepPoint { policy: policy.into(), label: label.into(), gpu_hours, p95_s, p99_s }
    }

    #[test]
    fn the_cheapest_point_meeting_every_target_is_chosen() {
        let pts = [
            p("notebookos", "cheap but slow", 50.0, 3.0, 9.0),
            p("notebookos", "ok", 70.0, 0.5, 4.0),
            p("notebookos", "ok, dearer", 74.0, 0.1, 1.0),
            p("notebookos", "p99 too high", 60.0, 0.9, 12.0),
            p("notebookos", "too dear", 80.0, 0.0, 0.0),
        ];
        let t = Targets::default();
        assert_eq!(choose(&pts, &t, 100.0, 10.0), Some(1));
        assert_eq!(choose(&pts, &t, 100.0, 1.0), None, "nothing has p99 below 1 s");
        assert_eq!(choose(&pts, &Targets { max_cost_ratio: 0.5, ..t }, 100.0, 10.0), None);
    }

    #[test]
    fn without_a_point_meeting_every_target_the_lowest_p95_within_cost_and_p99_ships() {
        let pts = [
            p("notebookos", "cheap, p95 4", 60.0, 4.0, 9.0),
            p("notebookos", "p95 3", 70.0, 3.0, 8.0),
            p("notebookos", "p95 2 but too dear", 80.0, 2.0, 8.0),
            p("notebookos", "p95 1 but p99 over", 65.0, 1.5, 30.0),
        ];
        let t = Targets::default();
        assert_eq!(choose(&pts, &t, 100.0, 20.0), None);
        assert_eq!(fallback(&pts, &t, 100.0, 20.0), Some(1));
        assert_eq!(fallback(&pts, &t, 100.0, 5.0), None, "nothing is within the p99 target");
    }

    #[test]
    fn the_front_keeps_only_points_nothing_beats() {
        let pts = [
            p("a", "", 10.0, 5.0, 0.0),
            p("a", "", 20.0, 1.0, 0.0),
            p("a", "", 25.0, 2.0, 0.0),
            p("a", "", 5.0, 9.0, 0.0),
        ];
        assert_eq!(front(&pts, |x| x.p95_s), vec![1, 0, 3], "point 2 is dearer and slower than point 1");
    }

    #[test]
    fn the_plot_has_every_point_and_marks_the_choice() {
        let pts = [
            p("reservation", "", 100.0, 0.0, 0.0),
            p("notebookos", "r=3", 70.0, 0.5, 4.0),
            p("notebookos", "r=7", 60.0, 2.0, 8.0),
        ];
        let svg = plot("t", &pts, "notebookos", Some(1), false);
        // 3 points + the chosen one, and a legend marker per dot series (3).
        assert_eq!(svg.matches("<circle").count(), 3 + 1 + 3);
        assert!(svg.contains("shipped: r=3") && svg.contains("notebookos: front"));
    }
}
