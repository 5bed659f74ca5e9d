//! Small statistics every report shares: nearest-rank percentiles and rounding.

use crate::Millis;

/// Rounds for stable, readable output.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[Millis], p: f64) -> Millis {
    if sorted.is_empty() {
        return 0;
    }
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss, reason = "rank")]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
