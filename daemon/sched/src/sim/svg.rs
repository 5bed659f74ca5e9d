//! Plots as SVG text, written by hand (a polyline per series, axes, ticks, a legend):
//! no plotting crate, no fonts to embed, and the bytes depend only on the data, so the
//! same seed gives the same files. Numbers are printed with fixed precision.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points (x, y), in x order.
    pub points: Vec<(f64, f64)>,
}

/// Axis scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear from 0.
    Linear,
    /// Base-10 logarithmic (x only; values clamped to the lowest decade).
    Log10,
}

/// A chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart<'a> {
    /// Title.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// X scale.
    pub x_scale: Scale,
    /// Lines.
    pub series: Vec<Series>,
}

const W: f64 = 820.0;
const H: f64 = 420.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 55.0;
const COLORS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A round step giving about `n` ticks over `[0, max]`.
fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v.abs() >= 100.0 || (v.fract() == 0.0 && v.abs() >= 1.0) {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_owned()
    }
}

impl Chart<'_> {
    /// Renders the chart.
    pub fn render(&self) -> String {
        self.render_with_dots(&[])
    }

    /// Renders the chart with `dots` drawn as unconnected markers (a scatter plot: one
    /// colour per series, after the lines' colours), the axes covering both.
    pub fn render_with_dots(&self, dots: &[Series]) -> String {
        let pts = || self.series.iter().chain(dots).flat_map(|s| s.points.iter());
        let (x_lo, x_hi) = match self.x_scale {
            Scale::Linear => (0.0, pts().map(|p| p.0).fold(0.0, f64::max).max(1e-9)),
            Scale::Log10 => {
                let lo = pts().map(|p| p.0).filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
                let lo = if lo.is_finite() { 10f64.powf(lo.log10().floor()) } else { 0.001 };
                let hi = pts().map(|p| p.0).fold(lo * 10.0, f64::max);
                (lo.log10(), 10f64.powf(hi.log10().ceil()).log10())
            }
        };
        let y_step = nice_step(pts().map(|p| p.1).fold(0.0, f64::max), 5.0);
        let y_hi = (pts().map(|p| p.1).fold(0.0, f64::max) / y_step).ceil().max(1.0) * y_step;
        let xv = |x: f64| match self.x_scale {
            Scale::Linear => x,
            Scale::Log10 => x.max(10f64.powf(x_lo)).log10(),
        };
        let px = |x: f64| L + (xv(x) - x_lo) / (x_hi - x_lo).max(1e-12) * (W - L - R);
        let py = |y: f64| H - B - y / y_hi * (H - T - B);
        let mut o = String::new();
        let _ = writeln!(
            o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">"
        );
        let _ = writeln!(o, "<rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>");
        let _ = writeln!(
            o,
            "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
            W / 2.0,
            esc(self.title)
        );
        // Y grid and ticks.
        let mut y = 0.0;
        while y <= y_hi + y_step / 2.0 {
            let yy = py(y);
            let _ = writeln!(o, "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>", W - R);
            let _ =
                writeln!(o, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", L - 6.0, yy + 4.0, label(y));
            y += y_step;
        }
        // X ticks.
        match self.x_scale {
            Scale::Linear => {
                let step = nice_step(x_hi, 8.0);
                let mut x = 0.0;
                while x <= x_hi + step / 2.0 {
                    let xx = px(x);
                    let _ = writeln!(
                        o,
                        "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>",
                        H - B,
                        H - B + 5.0
                    );
                    let _ = writeln!(
                        o,
                        "<text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                        H - B + 18.0,
                        label(x)
                    );
                    x += step;
                }
            }
            Scale::Log10 => {
                #[expect(clippy::cast_possible_truncation, reason = "decades of a delay: small")]
                let (a, b) = (x_lo.round() as i32, x_hi.round() as i32);
                for d in a..=b {
                    let x = 10f64.powi(d);
                    let xx = px(x);
                    let _ = writeln!(
                        o,
                        "<line x1=\"{xx:.1}\" y1=\"{T}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
                        H - B
                    );
                    let _ = writeln!(
                        o,
                        "<text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                        H - B + 18.0,
                        label(x)
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            "<polyline points=\"{L},{T} {L},{:.1} {:.1},{:.1}\" fill=\"none\" stroke=\"black\"/>",
            H - B,
            W - R,
            H - B
        );
        let _ = writeln!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            (L + W - R) / 2.0,
            H - 12.0,
            esc(self.x_label)
        );
        let _ = writeln!(
            o,
            "<text transform=\"translate(16,{:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            (T + H - B) / 2.0,
            esc(self.y_label)
        );
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut line = String::new();
            for &(x, y) in &s.points {
                let _ = write!(line, "{:.1},{:.1} ", px(x), py(y));
            }
            let _ = writeln!(
                o,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>",
                line.trim_end()
            );
            let ly = T + 8.0 + 16.0 * i as f64;
            let _ = writeln!(
                o,
                "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>",
                L + 10.0,
                L + 30.0
            );
            let _ = writeln!(o, "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>", L + 36.0, ly + 4.0, esc(&s.name));
        }
        for (j, s) in dots.iter().enumerate() {
            let i = self.series.len() + j;
            let color = COLORS[i % COLORS.len()];
            for &(x, y) in &s.points {
                let _ = writeln!(o, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{color}\"/>", px(x), py(y));
            }
            let ly = T + 8.0 + 16.0 * i as f64;
            let _ = writeln!(o, "<circle cx=\"{:.1}\" cy=\"{ly:.1}\" r=\"4\" fill=\"{color}\"/>", L + 20.0);
            let _ = writeln!(o, "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>", L + 36.0, ly + 4.0, esc(&s.name));
        }
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_deterministic_well_formed_svg() {
        let c = Chart {
            title: "t <1>",
            x_label: "x",
            y_label: "y",
            x_scale: Scale::Log10,
            series: vec![Series { name: "a".into(), points: vec![(0.002, 0.1), (3.0, 0.9), (40.0, 1.0)] }],
        };
        let s = c.render();
        assert_eq!(s, c.render());
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("t &lt;1&gt;") && s.contains("<polyline"));
        let dotted = c.render_with_dots(&[Series { name: "d".into(), points: vec![(1.0, 0.5)] }]);
        assert_eq!(dotted.matches("<circle").count(), 2, "one dot and its legend marker");
        let lin = Chart { x_scale: Scale::Linear, ..c }.render();
        assert!(lin.contains(">a</text>"));
        assert_eq!(nice_step(97.0, 5.0), 20.0);
        assert_eq!(label(0.25), "0.25");
    }
}
