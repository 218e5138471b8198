//! The test hook `IRIS_GATEWAY_KILL_AT`: the places where a test may end the process as a
//! power cut would, so the next start can be held to serving everything acknowledged. Every
//! room may name a kill point; this room names none of the others.

const KILL_ENV: &str = "IRIS_GATEWAY_KILL_AT";

/// A place where a start can be cut short by the test hook `IRIS_GATEWAY_KILL_AT`.
#[derive(Debug, Clone, Copy)]
pub struct KillPoint {
    pub name: &'static str,
    /// A start killed at this point first leaves the state the hook needs (a start that puts
    /// a safety copy back needs one left behind).
    pub after: Option<&'static str>,
}

const fn point(name: &'static str) -> KillPoint {
    KillPoint { name, after: None }
}

/// Every kill point of a start, in the order a start meets them (open, migration from layout
/// 1, the compression rebuild, the upgrade to layout 3, the server's recovery). The tests in
/// tests/start_crash.rs kill a start at each of them and require the next start to serve
/// everything that was acknowledged, so a step added here is covered at once. A point that
/// flushes sled first stands for sled's background flush having run just before the power went.
pub const START_KILL_POINTS: &[KillPoint] = &[
    // A complete copy of `db/` is in `.open-check/`; sled has not seen the files.
    point("open-copied"),
    // sled has opened the files: written its snapshot, cut the torn tail of its log.
    point("open-sled-opened"),
    // Half of the files of a copy put back (after a start killed with its copy in place).
    KillPoint {
        name: "put-back-partial",
        after: Some("open-sled-opened"),
    },
    // Every record read back, sled opened again.
    point("open-read-back"),
    // A commit cut short dropped, the last record's redo applied (flushed).
    point("open-recovered"),
    // Layout 1: the history database built and checkpointed; sled still layout 1.
    point("migrate-history-built"),
    // Layout 1: frame lists rewritten in sled (flushed); the layout record still says 1.
    point("migrate-frames"),
    // Layout 1: the layout record says 2 (flushed); the old trees are still there.
    point("migrate-layout2"),
    // The history database opened and checked against sled's journal.
    point("open-history-checked"),
    // The safety copy removed.
    point("open-copy-discarded"),
    // The compressed copy written to `db.rebuild/`, not yet fsynced.
    point("rebuild-copied"),
    // The copy fsynced, the witness no longer claims a snapshot; nothing swapped yet.
    point("rebuild-synced"),
    // `db/` renamed to `db.uncompressed/`, the copy not yet renamed to `db/`.
    point("rebuild-old-aside"),
    // The copy is `db/`; the old files are still beside it.
    point("rebuild-swapped"),
    // The old files removed; sled has not opened the copy yet, so it has no snapshot.
    point("rebuild-done"),
    // sled opened the copy (its first snapshot).
    point("rebuild-reopened"),
    // Layout 2 → 3: the commit record written (flushed), the layout record still says 2.
    point("layout3-record"),
    // Layout 3 written and flushed; the default channel not checked yet.
    point("layout3-done"),
    // The journal applied to the history database.
    point("open-journal-applied"),
    // The witness written: the store is open.
    point("open-witness"),
    // The server settled the turns the last run left (their notices committed and synced).
    point("start-recovered"),
];

/// Test hook: ends the process as a power cut would at the start's kill point `name`, when
/// `IRIS_GATEWAY_KILL_AT` names it (debug builds only). With `flush`, sled's writes so far are
/// made to reach the file first, as its background flush might have done.
pub fn kill_point(name: &str, flush: Option<&sled::Db>) {
    debug_assert!(
        START_KILL_POINTS.iter().any(|p| p.name == name),
        "kill point {name} is not in START_KILL_POINTS"
    );
    if kill_hook().as_deref() == Some(name) {
        if let Some(db) = flush {
            let _ = db.flush();
        }
        kill_now();
    }
}

/// The test hook `IRIS_GATEWAY_KILL_AT` (tests/durability.rs): where to kill the process with
/// SIGKILL, to prove what a crash there leaves. Debug builds only: the release binary people
/// run never reads it.
pub(in crate::store) fn kill_hook() -> Option<String> {
    if cfg!(debug_assertions) {
        std::env::var(KILL_ENV).ok()
    } else {
        None
    }
}

/// Ends the process as a power cut would, for the kill hooks.
pub(in crate::store) fn kill_now() {
    // SAFETY: raising a signal in our own process.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
}
