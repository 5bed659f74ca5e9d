//! A tiny property-test harness for the scheduler core: a splitmix64 generator and a
//! loop over seeded cases (this crate has no proptest dependency; a failing case
//! prints its seed, which reproduces it).

/// splitmix64: small, fast, and good enough to generate test inputs.
pub(crate) struct Gen(u64);

impl Gen {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub(crate) fn u32(&mut self, lo: u32, hi: u32) -> u32 {
        u32::try_from(self.range(u64::from(lo), u64::from(hi))).unwrap_or(hi)
    }

    pub(crate) fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// Runs `check` on `cases` generated inputs; the panic message names the failing seed.
pub(crate) fn cases(n: u64, mut check: impl FnMut(&mut Gen)) {
    for seed in 0..n {
        let mut g = Gen::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xA5A5);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&mut g)));
        if let Err(e) = r {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()));
            panic!("property failed for case seed {seed}: {}", msg.unwrap_or_default());
        }
    }
}
