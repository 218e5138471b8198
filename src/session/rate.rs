//! The session's frame and byte rates: token buckets over what the device sends.

use std::time::Duration;

use tokio_tungstenite::tungstenite::Message;

/// A per-connection token bucket: `frames_per_second` / `frame_burst`, and
/// `bytes_per_second` / `byte_burst`. Starts full.
pub struct RateLimit {
    tokens: f64,
    last: tokio::time::Instant,
    rate: f64,
    burst: f64,
}

impl RateLimit {
    pub fn new(rate: f64, burst: f64) -> RateLimit {
        RateLimit {
            tokens: burst,
            last: tokio::time::Instant::now(),
            rate,
            burst,
        }
    }

    /// Adds what the rate earned since the last look, up to the burst.
    pub fn refill(&mut self) {
        let now = tokio::time::Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
    }

    /// Takes `n` tokens if there are that many.
    pub fn take(&mut self, n: f64) -> bool {
        self.refill();
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// One frame's token.
    pub fn allow(&mut self) -> bool {
        self.take(1.0)
    }

    /// How long until the bucket holds `n` tokens (capped at the burst).
    pub fn wait_for(&mut self, n: f64) -> Duration {
        self.refill();
        let missing = n.min(self.burst) - self.tokens;
        if missing <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(missing / self.rate)
        }
    }

    /// Takes `n` tokens whatever the balance (it may go below zero: later frames wait).
    pub fn spend(&mut self, n: f64) {
        self.refill();
        self.tokens -= n;
    }
}

/// Payload bytes of a data frame, for the byte rate (control frames are not counted).
pub fn data_bytes(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}
