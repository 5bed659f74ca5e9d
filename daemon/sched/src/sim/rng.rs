//! The simulator's seeded random numbers: splitmix64 (Steele et al.), hand-written so
//! that a seed gives the same stream on every platform and every version of the code
//! (no dependency whose algorithm could change under us).

/// A splitmix64 stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream for `seed`; `stream` separates independent uses of one seed.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        // 53 random bits: exactly representable.
        #[expect(clippy::cast_precision_loss, reason = "53 bits fit an f64 mantissa")]
        let x = (self.next_u64() >> 11) as f64;
        x / (1u64 << 53) as f64
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Minutes (possibly fractional) to whole milliseconds, saturating at 0.
pub fn minutes_ms(min: f64) -> u64 {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to >= 0, small")]
    let ms = (min.max(0.0) * 60_000.0).round() as u64;
    ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_sane_distributions() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let xa: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(xa, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xa, (0..5).map(|_| c.next_u64()).collect::<Vec<_>>());
        let n = 20_000;
        let mean = (0..n).map(|_| a.exp(10.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 10.0).abs() < 0.5, "{mean}");
        assert!((0..1000).all(|_| (0.0..1.0).contains(&a.unit())));
        assert_eq!(minutes_ms(1.5), 90_000);
        assert_eq!(minutes_ms(-3.0), 0);
    }
}
