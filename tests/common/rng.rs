//! A seeded generator for the randomised tests, so a failing run can be replayed from its seed.

use std::time::Duration;

/// splitmix64: tiny, fast, and good enough for choosing test actions; any seed (0 too) works.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// An independent generator, so one part's draws do not shift another's.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next())
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration uniform in `lo..hi` seconds.
    pub fn secs(&mut self, (lo, hi): (f64, f64)) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * self.unit())
    }

    /// An exponential wait with the given mean: events arrive as a Poisson process.
    pub fn exp(&mut self, mean: f64) -> Duration {
        Duration::from_secs_f64(-mean * (1.0 - self.unit()).ln())
    }
}
