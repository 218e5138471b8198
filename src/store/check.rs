//! Checks at open: a damaged store is refused, never silently reset or cut short.
//!
//! sled recovers from a torn log tail (what a power cut leaves) by discarding it, and when its
//! snapshot file is gone it rebuilds from the log, discarding whatever it cannot read: on a
//! damaged SD card that silently loses history, or all of it (measured: a log cut in half with
//! the snapshot gone opened as an empty database). On other damage sled 0.34 returns an error,
//! often only when the damaged page is first read, or panics. So, before the gateway uses a store
//! that was used before:
//!
//! 1. `before_open`, without sled: the files sled needs are there and not empty, including its
//!    snapshot once one was seen. The witness (`DATA_DIR/store-witness.json`, written atomically
//!    beside the store after each open, every 30 s while cursors advance, and at shutdown)
//!    records the highest cursor known durable and whether sled had a snapshot.
//! 2. sled opens the files; a panic inside sled is caught by `PanicGuard` and reported as damage.
//! 3. `after_open`: every record of every tree is read back (see below), the layout record is
//!    there, and the cursor head is not below the witness's.
//!
//! Reading every record back costs time in proportion to the store (measured: 3.4 s of a
//! 3.7 s start with 100,000 messages on this machine's disk, several times that on an SD card),
//! so it and the safety copy are skipped when the last run stopped cleanly (its final flush
//! done, the witness marked `clean`) and a full check passed within `FULL_CHECK_EVERY_MS`: the
//! moments that damage a store are power cuts and crashes mid-write, and those always lead to
//! a full check at the next start. Damage at rest (a failing card) is then found by the
//! weekly full check, or when sled meets the damaged page, which fails the request, marks the
//! store failed and, on a panic, ends the process so that the next start checks in full.
//!
//! A failure is `StoreError::Damaged`, whose message says what is wrong and how to restore a
//! backup, and what the start changed before it found that (`damaged_message`): nothing, when
//! the safety copy was put back; else, honestly, what (sled opened without a copy, a rebuild an
//! interrupted start had begun finished, the history database opened).
//!
//! The witness claims only what is durable (format 2): sled's snapshot once its name is
//! fsynced, and not across the compression rebuild (`withdraw_snapshot_claim`). A power cut at
//! any step of a start must leave a store the next start opens; `START_KILL_POINTS` and
//! tests/start_crash.rs hold every step to that.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Result, Sled, Store, StoreError, META_LAYOUT};

pub const WITNESS_FILE: &str = "store-witness.json";
/// Exit status of `run` when the store is damaged (EX_DATAERR): the systemd unit does not
/// restart on it (`RestartPreventExitStatus=65`), since every attempt would fail the same way.
pub const EXIT_DAMAGED: u8 = 65;
/// A store opened and read back in full this recently is not copied again before opening: a
/// service manager restarting a gateway that fails after its store opened (a bad agent setting)
/// would otherwise copy the store every few seconds.
const RECHECK_AFTER_MS: i64 = 10 * 60 * 1000;
/// After a clean stop the store opens without the full read-back and the safety copy, unless
/// the last full check is older than this.
const FULL_CHECK_EVERY_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// How often the witness follows the head while cursors advance.
const WITNESS_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Witness {
    /// The highest cursor known to be durable in the store when this was written.
    cursor_head: u64,
    /// sled had a snapshot file (`db/snap.*`) by then: from then on a missing one is damage.
    snapshot: bool,
    updated_ms: i64,
    /// When the store last opened and read back in full (`RECHECK_AFTER_MS`).
    #[serde(default)]
    checked_ms: i64,
    /// Written by the last graceful stop after its final flush; any later write of the witness
    /// (the next open) clears it, so a crash or power cut leaves it false.
    #[serde(default)]
    clean: bool,
    #[serde(default)]
    about: String,
    /// 2 from this version on: `snapshot` is claimed only once the snapshot's name is durable
    /// (sled renames it into place without an fsync of its directory), and withdrawn before
    /// the compression rebuild swaps in a copy that has none yet. Older witnesses (0) made the
    /// claim without either, so their claim alone cannot prove damage (`before_open`).
    #[serde(default)]
    format: u32,
    /// With `clean`: sled's files as the graceful stop left them (`stamp_files`). A start that
    /// finds them otherwise (an older copy put back, a file replaced) checks in full, with the
    /// safety copy, instead of trusting the clean stop.
    #[serde(default)]
    files: Option<Vec<FileStamp>>,
}

/// The current witness format (see `Witness::format`).
const WITNESS_FORMAT: u32 = 2;

/// One file of sled's directory as the graceful stop left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileStamp {
    name: String,
    len: u64,
    mtime_ns: i128,
    inode: u64,
}

/// Every file under `db/` (names relative to it), sorted: enough to see that the files are not
/// the ones a clean stop left, without reading them.
fn stamp_files(db_dir: &Path) -> std::io::Result<Vec<FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![db_dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let m = entry.metadata()?;
            if m.is_dir() {
                stack.push(entry.path());
                continue;
            }
            let name = entry
                .path()
                .strip_prefix(db_dir)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push(FileStamp {
                name,
                len: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                inode: m.ino(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

impl Witness {
    pub(super) fn checked_ms(&self) -> i64 {
        self.checked_ms
    }

    /// Whether this open must read every record back (and take the safety copy first).
    pub(super) fn wants_full_check(witness: Option<&Witness>) -> bool {
        match witness {
            None => true,
            Some(w) => !w.clean || crate::ids::now_ms() - w.checked_ms >= FULL_CHECK_EVERY_MS,
        }
    }
}

/// What the witness last said, so it is rewritten only when there is news.
#[derive(Default)]
pub(super) struct WitnessClock {
    last: Mutex<Option<(Instant, u64, bool)>>,
    checked_ms: std::sync::atomic::AtomicI64,
}

impl WitnessClock {
    pub(super) fn checked_ms(&self) -> i64 {
        self.checked_ms.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the last witness written claimed a snapshot (made durable at open).
    fn claims_snapshot(&self) -> bool {
        self.last
            .lock()
            .ok()
            .and_then(|l| l.map(|(_, _, snap)| snap))
            .unwrap_or(false)
    }
}

/// The user-facing text of `StoreError::Damaged`. `touched`: what the start changed before it
/// found the damage; the message says "nothing" only when that is so.
pub fn damaged_message(dir: &Path, detail: &str, touched: &[String]) -> String {
    let changed = if touched.is_empty() {
        "Nothing was changed or removed.".to_owned()
    } else {
        format!(
            "Before it found that, this start changed: {}; nothing else was changed or removed.",
            touched.join("; ")
        )
    };
    format!(
        "the store in {db} is damaged: {detail}. {changed} To recover, restore your latest \
         backup with `iris-gateway restore FILE --data-dir {dir}` (backups are made with \
         `iris-gateway backup FILE`; restore keeps the damaged files aside). Without a backup, \
         move {dir} aside (keep it) to start with an empty store",
        db = dir.join("db").display(),
        dir = dir.display(),
    )
}

fn damaged(dir: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Damaged {
        dir: dir.to_owned(),
        detail: detail.into(),
        touched: Vec::new(),
    }
}

/// Adds what the start changed to a refusal's message (other errors pass unchanged).
pub(super) fn with_touched(e: StoreError, notes: &[String]) -> StoreError {
    match e {
        StoreError::Damaged {
            dir,
            detail,
            mut touched,
        } if !notes.is_empty() => {
            let mut all = notes.to_vec();
            all.append(&mut touched);
            StoreError::Damaged {
                dir,
                detail,
                touched: all,
            }
        }
        e => e,
    }
}

/// Withdraws the witness's snapshot claim, durably, before the compression rebuild puts a copy
/// in `db/` that has no snapshot yet (a claim left standing would refuse the next start if the
/// power went before sled wrote one: the copy is whole, only the claim was wrong). The next
/// open claims the new snapshot once it is durable.
pub(super) fn withdraw_snapshot_claim(dir: &Path) -> std::io::Result<()> {
    let path = witness_path(dir);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let Ok(mut w) = serde_json::from_slice::<Witness>(&text) else {
        // `before_open` read it at this start: it is not changed.
        return Ok(());
    };
    if !w.snapshot {
        return Ok(());
    }
    w.snapshot = false;
    w.clean = false;
    w.files = None;
    w.format = WITNESS_FORMAT;
    w.updated_ms = crate::ids::now_ms();
    let text = serde_json::to_vec_pretty(&w).expect("witness serialises");
    crate::atomic_file::write(&path, &text, 0o644)
}

fn witness_path(dir: &Path) -> PathBuf {
    dir.join(WITNESS_FILE)
}

/// Whether sled has a snapshot file in its directory (it writes one at every open that
/// recovers a log, renaming it into place, so one is always there once a store was reopened).
fn has_snapshot(db_dir: &Path) -> bool {
    std::fs::read_dir(db_dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("snap.") && !name.ends_with(".generating")
            })
        })
        .unwrap_or(false)
}

/// Step 1: the files are there. `None` for a store never opened by a gateway that writes
/// witnesses (a fresh data dir, or one from an older version).
pub(super) fn before_open(dir: &Path) -> Result<Option<Witness>> {
    let path = witness_path(dir);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(damaged(
                dir,
                format!("{} cannot be read ({e})", path.display()),
            ))
        }
    };
    let mut witness: Witness = serde_json::from_slice(&text).map_err(|e| {
        damaged(
            dir,
            format!(
                "{} is unreadable ({e}); if the store itself is fine, delete that file and start again",
                path.display()
            ),
        )
    })?;
    let db_dir = dir.join("db");
    let seen = format!("the store last held cursor {}", witness.cursor_head);
    if !db_dir.is_dir() {
        return Err(damaged(
            dir,
            format!("{} is missing ({seen})", db_dir.display()),
        ));
    }
    // Not `conf`: sled writes it without an fsync (a power cut soon after the first start can
    // leave it empty) and rewrites it from its defaults, which are the only ones used here.
    let log = db_dir.join("db");
    match std::fs::metadata(&log) {
        Ok(m) if m.len() > 0 => {}
        Ok(_) => return Err(damaged(dir, format!("{} is empty ({seen})", log.display()))),
        Err(_) => {
            return Err(damaged(
                dir,
                format!("{} is missing ({seen})", log.display()),
            ))
        }
    }
    if witness.snapshot && !has_snapshot(&db_dir) && witness.format < WITNESS_FORMAT {
        // An older version claimed the snapshot before its name was durable, and kept the
        // claim across the compression rebuild, whose copy has none until sled first opens
        // it: a start cut short there left exactly this, with every file whole. The claim
        // proves nothing; the full check (read-back, cursor head, journal) still runs.
        tracing::warn!(
            "{} says sled had a snapshot, and there is none: an older version wrote that claim \
             before it was durable (or before the store's files were rebuilt); checking the \
             store in full instead",
            path.display()
        );
        witness.snapshot = false;
        witness.clean = false;
        // And with the safety copy, however recent the last full check.
        witness.checked_ms = 0;
    }
    if witness.clean && witness.files.as_ref() != stamp_files(&db_dir).ok().as_ref() {
        // Put back, replaced or changed since: checked in full, with the safety copy, however
        // recent the last full check (that spares only a crash loop a copy per start).
        tracing::info!(
            "sled's files are not as the last clean stop left them: checking the store in full"
        );
        witness.clean = false;
        witness.checked_ms = 0;
    }
    if witness.snapshot && !has_snapshot(&db_dir) {
        return Err(damaged(
            dir,
            format!(
                "sled's snapshot file ({}/snap.*) is missing; without it sled would rebuild the \
                 store from its log and silently drop what it cannot read",
                db_dir.display()
            ),
        ));
    }
    Ok(Some(witness))
}

/// The history database against sled's journal (bounded: a few rows of each): SQLite has run
/// its own recovery by now, and `quick_look` read its newest messages back. Every journal
/// position it has not applied must still be in the journal (entries are dropped only once a
/// checkpoint made them durable in SQLite), and it cannot have applied more than sled ever
/// journaled: either means the two were not written together (an older copy of one of them
/// put back, or a lost file).
pub(super) fn history(dir: &Path, s: &Sled, hist: &super::sql::History) -> Result<()> {
    let path = super::sql::history_path(dir);
    let applied = hist.quick_look().map_err(|why| {
        damaged(
            dir,
            format!("its history database {} is damaged: {why}", path.display()),
        )
    })?;
    let meta_err = |e: sled::Error| damaged(dir, format!("the meta tree cannot be read: {e}"));
    let head = s.heads().journal;
    if applied > head {
        return Err(damaged(
            dir,
            format!(
                "its history database {} has changes up to {applied} but the store journaled only {head}: they do not belong together",
                path.display()
            ),
        ));
    }
    let first = s
        .journal
        .first()
        .map_err(meta_err)?
        .map(|(k, _)| super::u64_from(&k));
    let complete = match first {
        Some(first) => first <= applied + 1,
        None => applied == head,
    };
    if !complete {
        return Err(damaged(
            dir,
            format!(
                "its history database {} is older than the store (it has changes up to {applied}, the store's journal starts at {}): messages would be missing",
                path.display(),
                first.map_or(head + 1, |f| f)
            ),
        ));
    }
    Ok(())
}

/// Step 3: every record reads back and nothing is missing at the end.
pub(super) fn after_open(
    dir: &Path,
    t: &Sled,
    witness: Option<&Witness>,
    full: bool,
) -> Result<()> {
    if cfg!(debug_assertions)
        && full
        && std::env::var_os("IRIS_GATEWAY_TEST_PANIC_IN_OPEN").is_some()
    {
        // Test hook (tests/corruption.rs, debug builds only): a panic where sled's own would
        // come from.
        panic!("a panic raised by IRIS_GATEWAY_TEST_PANIC_IN_OPEN while reading the store back");
    }
    let names = if full { t.db.tree_names() } else { Vec::new() };
    for name in names {
        let tree = t.db.open_tree(&name).map_err(|e| {
            damaged(
                dir,
                format!(
                    "tree `{}` cannot be opened: {e}",
                    String::from_utf8_lossy(&name)
                ),
            )
        })?;
        for item in tree.iter() {
            if let Err(e) = item {
                return Err(damaged(
                    dir,
                    format!(
                        "tree `{}` cannot be read back: {e}",
                        String::from_utf8_lossy(&name)
                    ),
                ));
            }
        }
    }
    let meta_err = |e: sled::Error| damaged(dir, format!("the meta tree cannot be read: {e}"));
    // Outbox entries past the head are a commit a crash cut short before its record was
    // written (`commit::recover` drops them); a head older than what was durable is caught
    // by the witness below.
    let head = t.heads().cursor;
    let Some(w) = witness else {
        return Ok(());
    };
    if t.meta.get(META_LAYOUT).map_err(meta_err)?.is_none() {
        return Err(damaged(
            dir,
            format!(
                "it has lost its layout record (it looks empty, but held cursor {})",
                w.cursor_head
            ),
        ));
    }
    if head < w.cursor_head {
        return Err(damaged(
            dir,
            format!(
                "its last cursor is {head}, but cursor {} was durable when {} was written: the \
                 newest part of the store is missing (if you put older files back on purpose, \
                 delete that file and start again)",
                w.cursor_head,
                witness_path(dir).display()
            ),
        ));
    }
    Ok(())
}

impl Store {
    /// Records the store as it is on disk now (just opened or reopened: everything is durable).
    /// `checked_ms` is when every record was last read back: now after a full check, else the
    /// previous witness's.
    pub(super) fn record_witness(&self, checked_ms: i64) {
        self.shared
            .witness
            .checked_ms
            .store(checked_ms, std::sync::atomic::Ordering::SeqCst);
        let db_dir = self.shared.dir.join("db");
        // sled renames its snapshot into place without an fsync of the directory, and its log
        // is only `sync_file_range`d: both made durable before the witness claims them.
        let durable = self
            .t()
            .ok()
            .map(|t| t.db_file.sync_all().is_ok() && crate::atomic_file::sync_dir(&db_dir).is_ok());
        let snapshot = durable == Some(true) && has_snapshot(&db_dir);
        if let Ok(head) = self.cursor_head() {
            self.write_witness(head, snapshot, false);
        }
    }

    /// The last step of a graceful stop: flushes, then marks the witness `clean`, so the next
    /// start may skip the full read-back. Nothing may write to the store after this.
    pub fn close_cleanly(&self) -> Result<()> {
        self.sync_blocking()?;
        // The history database fsynced too, and the journal emptied: the next start has
        // nothing to apply.
        if let Err(e) = self.checkpoint_blocking() {
            tracing::warn!("history checkpoint at shutdown failed: {e}");
        }
        self.sync_blocking()?;
        let head = self.cursor_head()?;
        let snapshot = self.shared.witness.claims_snapshot();
        self.write_witness(head, snapshot, true);
        Ok(())
    }

    /// After a flush made everything up to `head` durable: follows the head every
    /// `WITNESS_EVERY` (or now, with `force`).
    pub(super) fn witness_durable(&self, head: u64, force: bool) {
        let (due, snapshot) = {
            let last = self.shared.witness.last.lock().ok();
            match last.as_deref().copied().flatten() {
                Some((at, h, snap)) => {
                    (h != head && (force || at.elapsed() >= WITNESS_EVERY), snap)
                }
                None => (true, false),
            }
        };
        if due {
            self.write_witness(head, snapshot, false);
        }
    }

    fn write_witness(&self, head: u64, snapshot: bool, clean: bool) {
        let files = if clean {
            stamp_files(&self.shared.dir.join("db")).ok()
        } else {
            None
        };
        let w = Witness {
            format: WITNESS_FORMAT,
            files,
            clean,
            cursor_head: head,
            snapshot,
            updated_ms: crate::ids::now_ms(),
            checked_ms: self
                .shared
                .witness
                .checked_ms
                .load(std::sync::atomic::Ordering::SeqCst),
            about:
                "written by iris-gateway to detect a damaged store at start; see docs/storage.md"
                    .into(),
        };
        let path = witness_path(&self.shared.dir);
        let text = serde_json::to_vec_pretty(&w).expect("witness serialises");
        match crate::atomic_file::write(&path, &text, 0o644) {
            Ok(()) => {
                if let Ok(mut last) = self.shared.witness.last.lock() {
                    *last = Some((Instant::now(), head, snapshot));
                }
            }
            // An older witness stays valid (it is below the durable head); only refusals of a
            // full or read-only disk are expected here.
            Err(e) => tracing::debug!("could not update {}: {e}", path.display()),
        }
    }
}

/// While alive, a panic on this thread or one of sled's own threads is reported as a damaged
/// store and ends the process with status 1: sled 0.34 panics on some damaged files, and the
/// release build aborts on panics (no unwinding to catch), so the message has to be printed
/// from the panic hook. Nothing has been written by then.
pub(super) struct PanicGuard;

/// The store being opened, the opening thread, and the safety copy to put back on a panic.
type Opening = (PathBuf, std::thread::ThreadId, Option<PathBuf>);
static OPENING: Mutex<Option<Opening>> = Mutex::new(None);

impl PanicGuard {
    pub(super) fn new(dir: &Path, safety: Option<&SafetyCopy>) -> PanicGuard {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let opening = OPENING
                    .lock()
                    .map(|o| o.clone())
                    .unwrap_or_else(|p| p.into_inner().clone());
                if let Some((dir, opener, safety)) = opening {
                    let me = std::thread::current();
                    let sled_thread = me.name().is_some_and(|n| n.contains("sled"));
                    if me.id() == opener || sled_thread {
                        let what = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        let at = info
                            .location()
                            .map(|l| format!(" ({}:{})", l.file(), l.line()))
                            .unwrap_or_default();
                        let mut detail =
                            format!("the storage engine failed while reading it: {what}{at}");
                        let touched = if safety.is_none() {
                            vec![format!("{NO_COPY_NOTE})")]
                        } else {
                            Vec::new()
                        };
                        if let Some(root) = safety {
                            if let Err(e) = SafetyCopy::put_back(&dir, &root) {
                                detail.push_str(&format!(
                                    "; the copy of its files taken before opening could not be \
                                     put back ({e}): it is in {}",
                                    root.display()
                                ));
                            }
                        }
                        eprintln!("iris-gateway: {}", damaged_message(&dir, &detail, &touched));
                        std::process::exit(EXIT_DAMAGED.into());
                    }
                }
                previous(info);
            }));
        });
        if let Ok(mut o) = OPENING.lock() {
            *o = Some((
                dir.to_owned(),
                std::thread::current().id(),
                safety.map(|s| s.root.clone()),
            ));
        }
        PanicGuard
    }
}

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if let Ok(mut o) = OPENING.lock() {
            *o = None;
        }
    }
}

/// A copy of sled's files taken before sled opens them, put back if the open fails.
///
/// sled "repairs" what it cannot read while it opens: it overwrites the rest of a segment
/// after the first unreadable record, blanks later segments and deletes its files for large
/// values past that point, and only then, sometimes, reports an error (measured: one flipped
/// byte near the start of the log had 205 KB of it overwritten before the open failed). After
/// a crash that is how it drops a torn, unacknowledged tail; on a damaged card it destroys
/// what a careful recovery could still read. So a store that was used before is copied first
/// (`DATA_DIR/.open-check/`; large-value files are hard links, which cost nothing), and if the
/// open or the checks after it fail, the copy is put back: the damaged files are left exactly
/// as they were. On success the copy is deleted. It costs one copy of the log per start (on a
/// Pi's SD card about 2 s per 50 MB); when the disk has no room for it, the store opens
/// without one and says so in the log.
pub(super) struct SafetyCopy {
    root: PathBuf,
}

const SAFETY_DIR: &str = ".open-check";
const SAFETY_COMPLETE: &str = "complete";
/// The files of the copy, one relative path a line, written before `complete`: putting the
/// copy back moves files out of it one by one, and a start cut short half-way must not take
/// the files already moved back for ones sled created.
const SAFETY_MANIFEST: &str = "manifest";

/// What a refusal says when sled opened the files without a copy taken first.
pub(super) const NO_COPY_NOTE: &str =
    "sled may have rewritten parts of its files in db/ while opening them (no copy was taken first";

/// What `SafetyCopy::take` did.
pub(super) struct Taken {
    pub copy: Option<SafetyCopy>,
    /// Why there is no copy of a store that was used before, for an honest refusal.
    pub why_none: Option<&'static str>,
    /// A copy an interrupted start had left was put back first.
    pub put_back_leftover: bool,
}

impl SafetyCopy {
    /// Takes the copy, or `None` for a new store (nothing to protect), a store another process
    /// has open (sled will say so; nothing here may touch its files), or when it does not fit.
    /// The caller holds the open lock (`open_lock`).
    pub(super) fn take(dir: &Path, witness: Option<&Witness>) -> std::io::Result<Taken> {
        let db_dir = dir.join("db");
        let root = dir.join(SAFETY_DIR);
        let none = |why_none, put_back_leftover| Taken {
            copy: None,
            why_none,
            put_back_leftover,
        };
        if in_use(&db_dir.join("db")) {
            return Ok(none(None, false));
        }
        let put_back = Self::recover_leftover(dir, &root)?;
        if !Witness::wants_full_check(witness) {
            tracing::debug!("the store was stopped cleanly and checked in full this week: no copy before opening");
            return Ok(none(
                Some("the last run stopped cleanly and the store was checked in full this week"),
                put_back,
            ));
        }
        if witness.is_some_and(|w| crate::ids::now_ms() - w.checked_ms < RECHECK_AFTER_MS) {
            tracing::debug!("the store was read back in full minutes ago: no copy before opening");
            return Ok(none(
                Some("the store had been read back in full less than 10 minutes before"),
                put_back,
            ));
        }
        let size = match std::fs::metadata(db_dir.join("db")) {
            Ok(m) if m.len() > 0 => m.len(),
            _ => return Ok(none(None, put_back)),
        };
        if let Ok(st) = super::statvfs(dir) {
            if st.available < size.saturating_add(super::STORE_RESERVE_BYTES) {
                tracing::warn!(
                    "not enough free space for a copy of the store before opening it ({} needed): \
                     opening without one, so a damaged store may be changed by the attempt",
                    super::human_bytes(size)
                );
                return Ok(none(Some("the disk had no room for it"), put_back));
            }
        }
        let copied = (|| {
            std::fs::create_dir_all(root.join("db"))?;
            let mut names = Vec::new();
            copy_tree(&db_dir, &root.join("db"), Path::new(""), &mut names)?;
            let mut manifest = names.join("\n");
            manifest.push('\n');
            crate::atomic_file::write(&root.join(SAFETY_MANIFEST), manifest.as_bytes(), 0o600)?;
            std::fs::File::create(root.join(SAFETY_COMPLETE))?;
            crate::atomic_file::sync_dir(&root)?;
            std::io::Result::Ok(())
        })();
        if let Err(e) = copied {
            let _ = std::fs::remove_dir_all(&root);
            return Err(e);
        }
        Ok(Taken {
            copy: Some(SafetyCopy { root }),
            why_none: None,
            put_back_leftover: put_back,
        })
    }

    /// The open succeeded: the copy goes. Its "complete" mark first, and durably: a complete
    /// copy left behind would be put back at the next start, undoing everything written since.
    pub(super) fn discard(self) -> std::io::Result<()> {
        std::fs::remove_file(self.root.join(SAFETY_COMPLETE))?;
        std::fs::File::open(&self.root)?.sync_all()?;
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            // Harmless now: an incomplete copy is simply removed at the next start.
            tracing::warn!("could not remove {}: {e}", self.root.display());
        }
        Ok(())
    }

    /// The open failed: every file of `db/` is put back as it was.
    pub(super) fn restore(self, dir: &Path) -> std::io::Result<()> {
        Self::put_back(dir, &self.root)
    }

    fn put_back(dir: &Path, root: &Path) -> std::io::Result<()> {
        let db_dir = dir.join("db");
        let saved_db = root.join("db");
        match std::fs::read_to_string(root.join(SAFETY_MANIFEST)) {
            Ok(manifest) => {
                let keep: std::collections::HashSet<&str> =
                    manifest.lines().filter(|l| !l.is_empty()).collect();
                // Files sled created while opening (a new snapshot, say) go; the saved ones
                // come back, each by a rename over what sled made of it. Run again after a
                // cut, it finds the files already back listed, and moves the rest.
                std::fs::create_dir_all(&db_dir)?;
                remove_unlisted(&db_dir, Path::new(""), &keep)?;
                let mut moved = 0;
                for name in &keep {
                    let from = saved_db.join(name);
                    if !from.exists() {
                        continue;
                    }
                    let to = db_dir.join(name);
                    if let Some(parent) = to.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::rename(&from, &to)?;
                    moved += 1;
                    if moved == 1 {
                        super::kill_point("put-back-partial", None);
                    }
                }
                sync_dirs(&db_dir)?;
            }
            // A copy taken by an older version, put back as that version did.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                remove_files_not_in(&db_dir, &saved_db)?;
                move_tree(&saved_db, &db_dir)?;
                std::fs::File::open(&db_dir)?.sync_all()?;
            }
            Err(e) => return Err(e),
        }
        // Not complete any more before anything else of it goes: a cut from here leaves an
        // incomplete copy, which the next start only removes.
        std::fs::remove_file(root.join(SAFETY_COMPLETE))?;
        crate::atomic_file::sync_dir(root)?;
        std::fs::remove_dir_all(root)
    }

    /// A copy left by an open that was cut short (power cut, kill): a complete one is the
    /// state before that open and is put back; an incomplete one was taken before sled was
    /// given the files, which are therefore untouched. True when a copy was put back.
    fn recover_leftover(dir: &Path, root: &Path) -> std::io::Result<bool> {
        if !root.exists() {
            return Ok(false);
        }
        if root.join(SAFETY_COMPLETE).exists() {
            tracing::warn!(
                "an earlier start was interrupted while opening the store: putting back the copy \
                 of its files taken before that"
            );
            Self::put_back(dir, root)?;
            Ok(true)
        } else {
            std::fs::remove_dir_all(root)?;
            Ok(false)
        }
    }
}

/// Whether another process has sled's lock on this log file (it has the store open).
fn in_use(log: &Path) -> bool {
    use fs2::FileExt;
    match std::fs::OpenOptions::new().read(true).write(true).open(log) {
        // Dropping the file releases the probe's own lock at once.
        Ok(f) => f.try_lock_exclusive().is_err(),
        Err(_) => false,
    }
}

/// Serializes the opening of one data dir between processes (a gateway starting while an
/// offline `pair` runs, say): the safety copy and its putting back must never run while
/// another process is half-way through opening the same store. Held until the open is done.
pub(super) fn open_lock(dir: &Path, wait: Duration) -> Result<std::fs::File> {
    use fs2::FileExt;
    let path = dir.join(".open-check.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::open_io(dir, e))?;
    let deadline = Instant::now() + wait;
    while f.try_lock_exclusive().is_err() {
        if Instant::now() >= deadline {
            return Err(StoreError::Locked {
                dir: dir.to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(f)
}

/// Copies a directory tree: files of sled's `blobs/` are hard-linked (sled never rewrites one,
/// it only deletes them), the others copied and fsynced. `names` gets every file's path
/// relative to the top (`rel` is `from`'s).
fn copy_tree(from: &Path, to: &Path, rel: &Path, names: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        let rel = rel.join(entry.file_name());
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target, &rel, names)?;
        } else if kind.is_file() {
            names.push(rel.to_string_lossy().into_owned());
            if from.file_name().is_some_and(|n| n == "blobs") {
                std::fs::hard_link(entry.path(), &target)?;
            } else {
                std::fs::copy(entry.path(), &target)?;
                std::fs::File::open(&target)?.sync_all()?;
            }
        }
    }
    std::fs::File::open(to)?.sync_all()
}

/// Removes the files under `dir` whose relative path is not in `keep`.
fn remove_unlisted(
    dir: &Path,
    rel: &Path,
    keep: &std::collections::HashSet<&str>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            remove_unlisted(&entry.path(), &rel, keep)?;
        } else if !keep.contains(rel.to_string_lossy().as_ref()) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// fsyncs `dir` and every directory below it.
fn sync_dirs(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_dirs(&entry.path())?;
        }
    }
    crate::atomic_file::sync_dir(dir)
}

fn remove_files_not_in(current: &Path, saved: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(current)? {
        let entry = entry?;
        let twin = saved.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if twin.is_dir() {
                remove_files_not_in(&entry.path(), &twin)?;
            }
        } else if !twin.exists() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn move_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            move_tree(&entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        } else {
            std::fs::rename(entry.path(), &target)?;
        }
    }
    Ok(())
}
