//! The per-device query budget: how much of the history database's query thread one device
//! may use. Searches and history pages run there one at a time (`Store::query`), so a device
//! sending costly queries as fast as its frame rate allows would otherwise keep everyone
//! else's waiting behind its own. Each query is charged what it took on that thread (plus a
//! floor, `MIN_CHARGE`); the balance refills at `limits.query_ms_per_second` up to
//! `limits.query_burst_ms`, and a device in debt gets `rate_limited` until it is repaid.
//! Plain data: the hub (`search.rs`, `router.rs`) asks it and charges it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What a query costs at least, however fast it ran (the queue, the frame, the reply).
const MIN_CHARGE: Duration = Duration::from_millis(1);

#[derive(Default)]
pub(super) struct QueryBudgets {
    /// Device id → (balance in ms, when it was last brought up to date). One entry per device
    /// that queried: bounded by the paired devices.
    devices: HashMap<String, (f64, Instant)>,
}

impl QueryBudgets {
    fn balance(&mut self, device: &str, now: Instant, rate: f64, burst: f64) -> &mut f64 {
        let entry = self
            .devices
            .entry(device.to_owned())
            .or_insert((burst, now));
        let earned = now.saturating_duration_since(entry.1).as_secs_f64() * rate;
        entry.0 = (entry.0 + earned).min(burst);
        entry.1 = now;
        &mut entry.0
    }

    /// `Err(wait)` while the device's balance is spent: it may query again after `wait`.
    pub(super) fn check(
        &mut self,
        device: &str,
        now: Instant,
        per_second_ms: u32,
        burst_ms: u32,
    ) -> Result<(), Duration> {
        let rate = f64::from(per_second_ms.max(1));
        let balance = *self.balance(device, now, rate, f64::from(burst_ms));
        if balance > 0.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - balance) / rate))
        }
    }

    /// Charges a finished query (the balance may go below zero: a debt the next ones wait out).
    pub(super) fn charge(
        &mut self,
        device: &str,
        now: Instant,
        took: Duration,
        per_second_ms: u32,
        burst_ms: u32,
    ) {
        let cost = took.max(MIN_CHARGE).as_secs_f64() * 1000.0;
        *self.balance(
            device,
            now,
            f64::from(per_second_ms.max(1)),
            f64::from(burst_ms),
        ) -= cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_in_debt_waits_and_others_do_not() {
        let mut b = QueryBudgets::default();
        let t0 = Instant::now();
        assert!(b.check("a", t0, 250, 1000).is_ok());
        b.charge("a", t0, Duration::from_millis(1500), 250, 1000);
        // 500 ms in debt at 250 ms/s: two seconds (and a bit) to repay.
        let wait = b.check("a", t0, 250, 1000).unwrap_err();
        assert!(
            wait > Duration::from_secs(2) && wait < Duration::from_millis(2100),
            "{wait:?}"
        );
        assert!(b.check("b", t0, 250, 1000).is_ok());
        assert!(b
            .check("a", t0 + Duration::from_millis(2100), 250, 1000)
            .is_ok());
    }
}
