//! When sled is reopened to write its snapshot (`Store::bound_replay`): the bound on what a
//! start after a crash replays, weighed against what each reopen writes.
//!
//! A start after a SIGKILL or a power cut replays sled's log from its last snapshot, which
//! sled 0.34.7 writes only when it opens; reopening it bounds that replay. But a reopen
//! writes too, and more as the store grows: zeros over every free segment of its log (512 KiB
//! each), zeros from the log's tip to the end of its segment, the snapshot
//! (docs/storage.md, "A start after a crash: what sled replays"). A bound by records reopened
//! every 5,000 of them whatever the reopen cost, so the reopens' share of the writes grew with
//! the store. This bound counts what the replay reads, bytes of sled's log, and waits before
//! the next reopen until the log has grown by `REOPEN_AMORTISED` times what the last reopen
//! wrote, between a floor (a crash start on a small store replays no more than before) and a
//! cap (on a large one, no more than `REPLAY_CAP_BYTES`).

/// Log bytes after which sled is reopened whatever the last reopen wrote: about the 5,000
/// records (~270 demo turns) the bound by records allowed.
const REPLAY_FLOOR_BYTES: u64 = 2 << 20;
/// Log bytes a start after a crash replays at most, however much a reopen writes: ~550 demo
/// turns with a full outbox. 16 MiB made a release start after a 100,000-message burst take
/// ~1.0 s, 4 MiB 0.4 s (docs/storage.md, "A start after a crash: what sled replays", has the
/// trade-off: more reopens on a large store, ~3 KB more written a turn).
const REPLAY_CAP_BYTES: u64 = 4 << 20;
/// The log must have grown by this many times what the last reopen wrote before the next one:
/// below the cap, reopens add at most an eighth to sled's log writes.
const REOPEN_AMORTISED: u64 = 8;
/// sled log bytes per byte committed, until a reopen measured it (the demo turns' figure here:
/// JSON frames compressed, leaves rewritten, the commit records).
const LOG_BYTES_PER_COMMITTED: f64 = 4.0;
/// sled records after which the bound by records reopened (`Policy::Records`).
const REPLAY_BOUND_RECORDS: u64 = 5_000;

/// Test hooks (debug builds only): `IRIS_GATEWAY_REPLAY_POLICY=records` brings back the bound
/// by records (for the benchmark's comparison), with `IRIS_GATEWAY_REPLAY_BOUND` records;
/// `IRIS_GATEWAY_REPLAY_BOUND_BYTES` and `IRIS_GATEWAY_REPLAY_CAP_BYTES` set the floor and the
/// cap, so a short run reopens sled.
const POLICY_ENV: &str = "IRIS_GATEWAY_REPLAY_POLICY";
const BOUND_RECORDS_ENV: &str = "IRIS_GATEWAY_REPLAY_BOUND";
const FLOOR_ENV: &str = "IRIS_GATEWAY_REPLAY_BOUND_BYTES";
const CAP_ENV: &str = "IRIS_GATEWAY_REPLAY_CAP_BYTES";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    /// Reopen after this many records, as before.
    Records(u64),
    /// Reopen after this many log bytes: `REOPEN_AMORTISED` × the last reopen's writes,
    /// within `[floor, cap]`.
    LogBytes { floor: u64, cap: u64 },
}

/// What was written since sled last opened, and what the last reopen cost. One per store
/// (behind its lock in `Shared`).
#[derive(Debug)]
pub(in crate::store) struct ReplayBound {
    policy: Policy,
    records: u64,
    committed: u64,
    log_per_committed: f64,
    last_reopen_wrote: u64,
    /// The log position of sled's snapshot when it last opened (`snap.<lsn>`), to measure
    /// the log written between two opens.
    opened_at_lsn: Option<u64>,
}

/// What one reopen measured, for the log.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) struct Reopened {
    pub(in crate::store) records: u64,
    /// Bytes of values committed since the previous open.
    pub(in crate::store) committed: u64,
    /// Log bytes written since the previous open (what a crash start would have replayed),
    /// when both snapshots' positions are known.
    pub(in crate::store) log_bytes: Option<u64>,
    /// The bound the next reopen waits for, in log bytes (`None`: by records).
    pub(in crate::store) next_bound: Option<u64>,
}

impl ReplayBound {
    /// The bound for a store whose sled just opened with its snapshot at `lsn`; the test hooks
    /// read (debug builds only).
    pub(in crate::store) fn new(lsn: Option<u64>) -> ReplayBound {
        let hook = |name: &str| std::env::var(name).ok().filter(|_| cfg!(debug_assertions));
        let number = |name: &str| hook(name).and_then(|v| v.parse::<u64>().ok());
        let policy = if hook(POLICY_ENV).as_deref() == Some("records") {
            Policy::Records(number(BOUND_RECORDS_ENV).unwrap_or(REPLAY_BOUND_RECORDS))
        } else {
            let floor = number(FLOOR_ENV).unwrap_or(REPLAY_FLOOR_BYTES);
            Policy::LogBytes {
                floor,
                cap: number(CAP_ENV).unwrap_or(REPLAY_CAP_BYTES).max(floor),
            }
        };
        ReplayBound {
            policy,
            records: 0,
            committed: 0,
            log_per_committed: LOG_BYTES_PER_COMMITTED,
            last_reopen_wrote: 0,
            opened_at_lsn: lsn,
        }
    }

    /// A commit of `records` sled records and about `bytes` bytes of values.
    pub(in crate::store) fn committed(&mut self, records: u64, bytes: u64) {
        self.records += records;
        self.committed += bytes;
    }

    /// The log bytes a crash start would replay now, as far as the commits tell.
    fn log_estimate(&self) -> u64 {
        (self.committed as f64 * self.log_per_committed) as u64
    }

    /// The log bytes the next reopen waits for.
    fn bound_bytes(&self, floor: u64, cap: u64) -> u64 {
        self.last_reopen_wrote
            .saturating_mul(REOPEN_AMORTISED)
            .clamp(floor, cap)
    }

    /// Whether enough was written since sled opened to reopen it.
    pub(in crate::store) fn due(&self) -> bool {
        match self.policy {
            Policy::Records(bound) => self.records >= bound,
            Policy::LogBytes { floor, cap } => self.log_estimate() >= self.bound_bytes(floor, cap),
        }
    }

    /// sled was reopened: its snapshot is now at `lsn`, and the reopen wrote `wrote` bytes
    /// (`None` where the system cannot say). Learns the log bytes per committed byte from the
    /// two snapshots' positions.
    pub(in crate::store) fn reopened(&mut self, lsn: Option<u64>, wrote: Option<u64>) -> Reopened {
        let log_bytes = match (self.opened_at_lsn, lsn) {
            (Some(before), Some(now)) if now > before => Some(now - before),
            _ => None,
        };
        if let Some(log) = log_bytes.filter(|_| self.committed > 0) {
            self.log_per_committed = log as f64 / self.committed as f64;
        }
        // Unknown: as the floor allows, which is no worse than the bound by records.
        self.last_reopen_wrote = wrote.unwrap_or(0);
        let (records, committed) = (self.records, self.committed);
        self.after_open(lsn);
        Reopened {
            records,
            committed,
            log_bytes,
            next_bound: match self.policy {
                Policy::Records(_) => None,
                Policy::LogBytes { floor, cap } => Some(self.bound_bytes(floor, cap)),
            },
        }
    }

    /// sled opened again (after a storage failure, or a reopen): nothing written since.
    pub(in crate::store) fn after_open(&mut self, lsn: Option<u64>) {
        self.records = 0;
        self.committed = 0;
        self.opened_at_lsn = lsn;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_bound(floor: u64, cap: u64) -> ReplayBound {
        ReplayBound {
            policy: Policy::LogBytes { floor, cap },
            ..ReplayBound::new(Some(0))
        }
    }

    #[test]
    fn the_next_reopen_waits_for_the_log_to_grow_by_what_the_last_one_wrote() {
        let mut b = bytes_bound(1_000, 1_000_000);
        b.committed(10, 200);
        assert!(!b.due(), "800 estimated log bytes are below the floor");
        b.committed(10, 100);
        assert!(b.due());
        // 3,000 log bytes for 300 committed: 10 per byte from now on.
        let r = b.reopened(Some(3_000), Some(5_000));
        assert_eq!(r.log_bytes, Some(3_000));
        assert_eq!(r.next_bound, Some(5_000 * REOPEN_AMORTISED));
        b.committed(5, 3_999);
        assert!(!b.due());
        b.committed(1, 1);
        assert!(b.due());
    }

    #[test]
    fn the_cap_bounds_the_replay_however_much_a_reopen_writes() {
        let mut b = bytes_bound(1_000, 50_000);
        b.committed(1, 250);
        b.reopened(Some(1_000), Some(1 << 30));
        b.committed(1, 12_499);
        assert!(!b.due());
        b.committed(1, 1);
        assert!(b.due(), "50,000 estimated log bytes reach the cap");
    }

    #[test]
    fn by_records_it_counts_records_only() {
        let mut b = ReplayBound {
            policy: Policy::Records(100),
            ..ReplayBound::new(None)
        };
        b.committed(99, 1 << 30);
        assert!(!b.due());
        b.committed(1, 0);
        assert!(b.due());
        assert_eq!(b.reopened(None, Some(1 << 20)).next_bound, None);
        assert!(!b.due());
    }
}
