//! The journal's way into the history database: what sled made durable is applied to SQLite
//! (`apply_journal`, off the event loop), reads catch up first (`read_history`, `query`), and
//! checkpoints make SQLite durable so the journal entries they cover can go (`maybe_checkpoint`,
//! `prune_journal`). sled's journal is the log of record; SQLite only ever follows it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::base::{from_json, u64_from, Result, StoreError};
use super::engine::handle::{Store, Trees};
use super::engine::kill_points::{kill_now, kill_point};
use super::{sql_query, sql_write};

impl Store {
    /// At open: what sled made durable before a crash but the history database lost or never
    /// got is applied now, before anything reads history.
    pub(super) fn replay_journal(&self) -> Result<()> {
        // Entries below the journal's first are durable in SQLite (a checkpoint pruned them):
        // the volume bound of `maybe_checkpoint` counts from there, not from 0.
        let t = self.t()?;
        let settled = match t.journal.first()? {
            Some((k, _)) => u64_from(&k).saturating_sub(1),
            None => t.heads().journal,
        };
        self.shared.durable_applied.store(settled, Ordering::SeqCst);
        drop(t);
        // What sled made durable before a crash but the history database lost or never got.
        self.apply_journal()?;
        kill_point("open-journal-applied", None);
        Ok(())
    }

    /// Runs `f` on the history database's query thread, after bringing the database up to
    /// date with the journal there (read-your-writes, as `read_history`); returns what it gave
    /// and how long the thread spent on it (the device's query budget, `hub/budget.rs`). The
    /// event loop only awaits: the queue is first in first out, and each device has at most
    /// one query in it (the hub answers a device's frames one at a time), so one device's
    /// queries cannot keep another's waiting for more than one of them.
    pub(super) async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&sql_query::Query<'_>) -> Result<T> + Send + 'static,
    ) -> Result<(T, Duration)> {
        let t = self.t()?;
        let store = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        t.hist.run(Box::new(move |q| {
            store.catch_up();
            // Timed after the catch-up: a device pays for its query, not for others' writes.
            let started = std::time::Instant::now();
            let r = match store.t().and_then(|t| Ok((store.unapplied(&t)?, t))) {
                Ok((None, _)) => f(q),
                Ok((Some(pending), t)) => t.hist.read_with(&pending, f),
                Err(e) => Err(e),
            }
            .map(|v| (v, started.elapsed()));
            let _ = tx.send(r);
        }))?;
        drop(t);
        rx.await
            .map_err(|_| StoreError::Closed("a history query did not finish".into()))?
    }

    /// `query` on this thread, through the writing connection (tools, tests, benchmarks).
    pub(super) fn query_blocking<T>(
        &self,
        f: impl FnOnce(&sql_query::Query<'_>) -> Result<T>,
    ) -> Result<T> {
        let t = self.read_history()?;
        match self.unapplied(&t)? {
            None => t.hist.read(f),
            Some(pending) => t.hist.read_with(&pending, f),
        }
    }

    /// What sled made durable and the history database lacks after a catch-up: nothing once
    /// it applied it all; when applying failed (a full or read-only disk), the entries a read
    /// applies for itself alone and rolls back (`History::read_with`), so it still sees every
    /// acknowledged message while nothing can be written: the oldest `APPLY_BATCH` of them
    /// (a store without its free-space reserve may take more before sled meets the full disk;
    /// the read does without the newest then, as `history_behind` says).
    fn unapplied(&self, t: &Trees) -> Result<Option<Vec<(u64, sql_write::Op)>>> {
        let last = t.durable_journal.load(Ordering::SeqCst);
        let applied = t.hist.applied()?;
        if last <= applied {
            return Ok(None);
        }
        Ok(Some(journal_batch(t, applied, last)?))
    }

    /// Applies what is durable but not yet in the history database (off the event loop).
    pub(super) fn catch_up(&self) {
        if let Ok(t) = self.t() {
            if t.durable_journal.load(Ordering::SeqCst) > t.hist.applied().unwrap_or(0) {
                self.apply_or_note();
            }
        }
    }

    /// The trees, with the history database first brought up to date with the journal. Every
    /// read of history goes through here: a user message waits for its turn's reply (`sync`),
    /// and a device still sees it in the `history` it asks for right after its
    /// `read.receipt`.
    pub(super) fn read_history(&self) -> Result<Arc<Trees>> {
        let t = self.t()?;
        if t.durable_journal.load(Ordering::SeqCst) > t.hist.applied()? {
            // A failure is noted (`history_behind`, the gateway reports `degraded`); the
            // read still answers with what the history database has.
            self.apply_or_note();
        }
        Ok(t)
    }

    /// Applies the journal; a failure (the disk full under SQLite) does not fail the sync:
    /// what sled made durable is stored, and will reach the history database when the disk
    /// works (`retry_apply`). Until then `history_behind` says why, and the gateway reports
    /// `degraded`.
    pub(super) fn apply_or_note(&self) {
        let result = self.apply_journal();
        let mut behind = self
            .shared
            .history_behind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(()) => *behind = None,
            Err(e) => {
                if behind.is_none() {
                    tracing::warn!("the history database is behind the store: {e}");
                }
                *behind = Some(e.to_string());
            }
        }
    }

    /// Why the history database lacks changes that are durable in sled, if it does.
    pub fn history_behind(&self) -> Option<String> {
        self.shared
            .history_behind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Applies what the history database lacks (after a failure to): `Ok` once it has it all.
    pub fn retry_apply(&self) -> Result<()> {
        self.apply_or_note();
        match self.history_behind() {
            None => Ok(()),
            Some(why) => Err(StoreError::Closed(why)),
        }
    }

    /// Whether the `sync` that just made journal entries durable should also apply them. Not
    /// until `APPLY_EVERY_ENTRIES` have gathered: each SQLite transaction writes its own copy
    /// of the pages it touches into the WAL (the lane's and the id index's leaves, FTS5's
    /// structure record and a new segment, `applied`), so a few turns in one transaction
    /// write those pages once. Nothing waits for it: every read of history catches up first
    /// (`read_history`, `query`), and what waits is durable in sled's journal, which the next
    /// start applies. After a failed apply every sync tries again.
    pub(super) fn apply_due(&self, t: &Trees) -> bool {
        let backlog = t
            .durable_journal
            .load(Ordering::SeqCst)
            .saturating_sub(t.hist.applied().unwrap_or(0));
        if backlog == 0 {
            return false;
        }
        if self.history_behind().is_some() {
            return true;
        }
        match apply_every() {
            ApplyEvery::Entries(n) => backlog >= n,
            ApplyEvery::EachTurn => t.turns.is_empty(),
        }
    }

    /// Test hook: `IRIS_GATEWAY_KILL_AT=before-apply` ends the process with SIGKILL at the
    /// first `sync` that has history changes to apply, after their sled commit is durable and
    /// before the history database has them, so the tests can prove the journal repairs it at
    /// the next start.
    pub(super) fn kill_if_unapplied(&self) {
        let pending = self
            .t()
            .ok()
            .and_then(|t| Some(t.durable_journal.load(Ordering::SeqCst) > t.hist.applied().ok()?));
        if pending == Some(true) {
            kill_now();
        }
    }

    /// Applies the journal entries the history database does not have yet, in batches of one
    /// SQLite transaction each. Called only once they are durable in sled (`sync`, and at
    /// open): the history database must never hold a change that sled could lose.
    pub(super) fn apply_journal(&self) -> Result<()> {
        let t = self.t()?;
        // Only what sled made durable: the history database must never hold a change a crash
        // could take back from sled (and past the head lies what a failed commit wrote).
        let last = t.durable_journal.load(Ordering::SeqCst);
        let mut applied = t.hist.applied()?;
        while applied < last {
            let batch = journal_batch(&t, applied, last)?;
            let Some(&(end, _)) = batch.last() else {
                break;
            };
            t.hist.apply(&batch)?;
            applied = end;
        }
        Ok(())
    }

    /// Drops the journal entries a finished checkpoint made durable in SQLite; when the last
    /// checkpoint is `CHECKPOINT_EVERY` old, applies the journal and starts a checkpoint on a
    /// worker thread: the one fsync of the history database, off the event loop. A backlog of
    /// `APPLY_BATCH` entries is applied at once, so a read never has more than that to catch
    /// up on (`read_history`).
    pub(super) fn maybe_checkpoint(&self) {
        let durable = self.shared.durable_applied.load(Ordering::SeqCst);
        if durable > 0 {
            let _ = self.prune_journal(durable);
        }
        // The journal entries not yet durable in SQLite: what sled holds of history and what a
        // start after a crash reads back and SQLite replays from its WAL. A burst (a restore,
        // an automation storm) checkpoints by volume, not only every 5 minutes.
        let unsettled = self.t().ok().map_or(0, |t| {
            t.durable_journal
                .load(Ordering::SeqCst)
                .saturating_sub(durable)
        });
        let due = {
            let last = self
                .shared
                .last_checkpoint
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            last.elapsed() >= CHECKPOINT_EVERY || unsettled >= CHECKPOINT_AFTER_ENTRIES
        };
        let backlog = self.t().ok().and_then(|t| {
            let applied = t.hist.applied().ok()?;
            Some(
                t.durable_journal
                    .load(Ordering::SeqCst)
                    .saturating_sub(applied),
            )
        });
        let checkpoint = due && !self.shared.checkpointing.swap(true, Ordering::SeqCst);
        if !checkpoint {
            if backlog.is_some_and(|n| n >= APPLY_BATCH as u64) {
                let store = self.clone();
                tokio::task::spawn_blocking(move || store.apply_or_note());
            }
            return;
        }
        let Ok(t) = self.t() else {
            self.shared.checkpointing.store(false, Ordering::SeqCst);
            return;
        };
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            store.apply_or_note();
            let shared = &store.shared;
            match t.hist.checkpoint() {
                Ok(Some(p)) => shared.durable_applied.store(p, Ordering::SeqCst),
                Ok(None) => {}
                Err(e) => tracing::warn!("history checkpoint failed: {e}"),
            }
            *shared
                .last_checkpoint
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
            shared.checkpointing.store(false, Ordering::SeqCst);
        });
    }

    /// Removes journal entries up to `upto` (durable in SQLite): sled writes without a flush of
    /// their own, since an entry that comes back after a crash is skipped as already applied.
    pub(super) fn prune_journal(&self, upto: u64) -> Result<()> {
        let t = self.t()?;
        while let Some((k, _)) = t.journal.first()? {
            if u64_from(&k) > upto {
                break;
            }
            self.writable()?;
            t.journal.remove(k)?;
        }
        Ok(())
    }

    /// A checkpoint now, on this thread, then the journal pruned (graceful stop, tools and
    /// benchmarks that fill a store without the gateway's periodic checkpoints).
    pub fn checkpoint_blocking(&self) -> Result<()> {
        let t = self.t()?;
        if let Some(p) = t.hist.checkpoint()? {
            self.shared.durable_applied.store(p, Ordering::SeqCst);
            self.prune_journal(p)?;
        }
        Ok(())
    }
}

/// Up to `APPLY_BATCH` journal entries after position `after`, up to `last`.
fn journal_batch(t: &Trees, after: u64, last: u64) -> Result<Vec<(u64, sql_write::Op)>> {
    let mut batch = Vec::new();
    for item in t
        .journal
        .range((after + 1).to_be_bytes()..=last.to_be_bytes())
        .take(APPLY_BATCH)
    {
        let (k, v) = item?;
        batch.push((
            u64_from(&k),
            from_json::<sql_write::Op>(&v, "journal entry")?,
        ));
    }
    Ok(batch)
}

/// Journal entries applied per SQLite transaction.
const APPLY_BATCH: usize = 256;
/// Durable journal entries a sync leaves for a later one to apply with them (`apply_due`): a
/// demo turn journals two (the user's message and the answer), so eight turns share one
/// transaction. It bounds what a read catches up on before it answers, and what a start after
/// a crash applies beyond the last checkpoint.
const APPLY_EVERY_ENTRIES: u64 = 16;
/// Test hook (debug builds only): `IRIS_GATEWAY_APPLY_EVERY=N` applies once N entries wait,
/// `=turn` as before batching (at each sync with no turn waiting for its answer), so the
/// benchmarks can measure both builds' policies side by side and the tests can pin one.
const APPLY_EVERY_ENV: &str = "IRIS_GATEWAY_APPLY_EVERY";

/// When a sync applies the journal (`apply_due`).
#[derive(Debug, Clone, Copy)]
enum ApplyEvery {
    Entries(u64),
    EachTurn,
}

fn apply_every() -> ApplyEvery {
    static POLICY: std::sync::OnceLock<ApplyEvery> = std::sync::OnceLock::new();
    *POLICY.get_or_init(|| {
        let hook = std::env::var(APPLY_EVERY_ENV)
            .ok()
            .filter(|_| cfg!(debug_assertions));
        match hook.as_deref() {
            Some("turn") => ApplyEvery::EachTurn,
            Some(n) => ApplyEvery::Entries(n.parse().unwrap_or(APPLY_EVERY_ENTRIES).max(1)),
            None => ApplyEvery::Entries(APPLY_EVERY_ENTRIES),
        }
    })
}

/// How often the journal is applied to the history database and checkpointed (fsynced)
/// while history changes: bounds the journal in sled, the WAL, and what a start after a crash
/// applies; it is the only fsync SQLite does. Each checkpoint writes every page the changes
/// since touched once, so a longer interval writes the SD card less (docs/storage.md).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(300);
/// Journal entries after which a checkpoint is due whatever the time: bounds the journal in
/// sled, the WAL and what a start after a crash reads back during a burst of writes (a
/// household's 5 minutes are a few dozen entries).
const CHECKPOINT_AFTER_ENTRIES: u64 = 5_000;
