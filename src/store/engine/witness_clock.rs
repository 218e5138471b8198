//! What the witness file last said (`witness.rs`), kept in the store's shared state so the
//! witness is rewritten only when there is news. Its own file so the handle (`handle.rs`) can
//! hold it without importing the witness's `impl Store`; its fields are the witness room's.

/// What the witness last said, so it is rewritten only when there is news.
#[derive(Default)]
pub(in crate::store) struct WitnessClock {
    pub(super) last: std::sync::Mutex<Option<(std::time::Instant, u64, bool)>>,
    pub(super) checked_ms: std::sync::atomic::AtomicI64,
}

impl WitnessClock {
    pub(super) fn checked_ms(&self) -> i64 {
        self.checked_ms.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the last witness written claimed a snapshot (made durable at open).
    pub(super) fn claims_snapshot(&self) -> bool {
        self.last
            .lock()
            .ok()
            .and_then(|l| l.map(|(_, _, snap)| snap))
            .unwrap_or(false)
    }
}
