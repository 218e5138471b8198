//! Damage checks at open: a damaged store is refused, never silently reset or cut short.
//!
//! sled recovers from a torn log tail (what a power cut leaves) by discarding it, and when its
//! snapshot file is gone it rebuilds from the log, discarding whatever it cannot read: on a
//! damaged SD card that silently loses history, or all of it (measured: a log cut in half with
//! the snapshot gone opened as an empty database). On other damage sled 0.34 returns an error,
//! often only when the damaged page is first read, or panics. So, before the gateway uses a store
//! that was used before:
//!
//! 1. `before_open`, without sled: the files sled needs are there and not empty, including its
//!    snapshot once one was seen. The witness (`witness.rs`) records the highest cursor known
//!    durable and whether sled had a snapshot.
//! 2. sled opens the files; a panic inside sled is caught by `PanicGuard` and reported as damage.
//! 3. `after_open`: every record of every tree is read back (see below), the layout record is
//!    there, and the cursor head is not below the witness's.
//! 4. `history`: the history database belongs with sled's journal.
//!
//! Reading every record back costs time in proportion to the store (measured: 3.4 s of a
//! 3.7 s start with 100,000 messages on this machine's disk, several times that on an SD card),
//! so it and the safety copy (`safety_copy.rs`) are skipped when the last run stopped cleanly
//! (its final flush done, the witness marked `clean`) and a full check passed within a week
//! (`Witness::wants_full_check`): the moments that damage a store are power cuts and crashes
//! mid-write, and those always lead to a full check at the next start. Damage at rest (a
//! failing card) is then found by the weekly full check, or when sled meets the damaged page,
//! which fails the request, marks the store failed and, on a panic, ends the process so that
//! the next start checks in full.
//!
//! A failure is `StoreError::Damaged`, whose message says what is wrong and how to restore a
//! backup, and what the start changed before it found that (`damaged_message`): nothing, when
//! the safety copy was put back; else, honestly, what (sled opened without a copy, a rebuild an
//! interrupted start had begun finished, the history database opened).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::handle::Sled;
use super::safety_copy::{SafetyCopy, NO_COPY_NOTE};
use super::witness::{has_snapshot, stamp_files, witness_path, Witness, WITNESS_FORMAT};
use crate::store::base::{damaged_message, Result, StoreError, META_LAYOUT};

/// Exit status of `run` when the store is damaged (EX_DATAERR): the systemd unit does not
/// restart on it (`RestartPreventExitStatus=65`), since every attempt would fail the same way.
pub const EXIT_DAMAGED: u8 = 65;

fn damaged(dir: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Damaged {
        dir: dir.to_owned(),
        detail: detail.into(),
        touched: Vec::new(),
    }
}

/// Adds what the start changed to a refusal's message (other errors pass unchanged).
pub(in crate::store) fn with_touched(e: StoreError, notes: &[String]) -> StoreError {
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

/// Step 1: the files are there. `None` for a store never opened by a gateway that writes
/// witnesses (a fresh data dir, or one from an older version).
pub(in crate::store) fn before_open(dir: &Path) -> Result<Option<Witness>> {
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
pub(in crate::store) fn history(
    dir: &Path,
    s: &Sled,
    hist: &crate::store::sql::History,
) -> Result<()> {
    let path = crate::store::sql::history_path(dir);
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
        .map(|(k, _)| crate::store::base::u64_from(&k));
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
pub(in crate::store) fn after_open(
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

/// While alive, a panic on this thread or one of sled's own threads is reported as a damaged
/// store and ends the process with status 1: sled 0.34 panics on some damaged files, and the
/// release build aborts on panics (no unwinding to catch), so the message has to be printed
/// from the panic hook. Nothing has been written by then.
pub(in crate::store) struct PanicGuard;

/// The store being opened, the opening thread, and the safety copy to put back on a panic.
type Opening = (PathBuf, std::thread::ThreadId, Option<PathBuf>);
static OPENING: Mutex<Option<Opening>> = Mutex::new(None);

impl PanicGuard {
    pub(in crate::store) fn new(dir: &Path, safety: Option<&SafetyCopy>) -> PanicGuard {
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
