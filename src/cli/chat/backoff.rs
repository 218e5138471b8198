//! How long the client waits before trying the gateway again: soon after a restart (the common
//! case takes a second or two), then doubling up to a cap so a gateway that stays away is not
//! hammered; jittered so several terminals do not knock at the same instant.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The first wait after a lost connection.
pub(super) const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
pub(super) const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(15);

pub(super) struct Backoff {
    base: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: FIRST_RECONNECT_DELAY,
        }
    }
}

impl Backoff {
    /// A connection held: the next loss starts from the first wait again.
    pub(super) fn reset(&mut self) {
        self.base = FIRST_RECONNECT_DELAY;
    }

    /// The wait before the next attempt: the base with ±25 % jitter, never above the cap.
    pub(super) fn next_delay(&mut self) -> Duration {
        let base = self.base;
        self.base = (base * 2).min(MAX_RECONNECT_DELAY);
        // std's per-process random hash keys are random enough to spread retries.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let spread = base / 2;
        let offset = spread.mul_f64((random % 1000) as f64 / 1000.0);
        (base - base / 4 + offset).min(MAX_RECONNECT_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_their_jitter_and_stop_at_the_cap() {
        let mut b = Backoff::default();
        let mut base = FIRST_RECONNECT_DELAY;
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(
                d >= base - base / 4 && d <= base + base / 4,
                "{d:?} for {base:?}"
            );
            assert!(d <= MAX_RECONNECT_DELAY);
            base = (base * 2).min(MAX_RECONNECT_DELAY);
        }
        b.reset();
        assert!(b.next_delay() <= FIRST_RECONNECT_DELAY + FIRST_RECONNECT_DELAY / 4);
    }
}
