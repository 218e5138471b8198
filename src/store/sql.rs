//! The history database: every stored message, its id, its search index (FTS5) and its media
//! uses, in SQLite (`DATA_DIR/history/history.sqlite3`, WAL mode).
//!
//! Why not sled: sled 0.34 keeps per-page bookkeeping in memory for every page whatever its
//! cache size, and its pages follow the number of keys, so memory and start-up time grew with
//! history (docs/storage.md has the figures). SQLite keeps only its page cache in memory.
//!
//! SQLite is not the log of record: sled's journal is (`commit.rs`, `Store::commit`). Changes
//! reach this database only after the sled commit that carries them was fsynced (`journal.rs`),
//! applied in one SQLite transaction together with the journal position they reach
//! (`meta.applied`, `sql_write.rs`), so applying is idempotent and needs no fsync of its own
//! (`synchronous=NORMAL`: a power cut may roll back the newest transactions, which the journal
//! then applies again). Checkpoints (`checkpoint`) fsync the database on a worker thread; only
//! then are the journal entries they cover dropped. Reads run on the query thread
//! (`sql_query.rs`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::base::{Result, StoreError};
use super::sql_query::{lane_of, message_of, spawn_query_thread, Job, Query};
use crate::protocol::{HistoryMessage, Lane};

pub const HISTORY_DIR: &str = "history";
pub(super) const HISTORY_FILE: &str = "history.sqlite3";
/// SQLite's page cache of the serving connection: small on purpose (the OS page cache does the rest), so
/// memory does not follow history.
const CACHE_KIB: i64 = 512;
/// FTS5 index leaf size: what a table row keeps in a 1 KiB page without an overflow page
/// (989 bytes of payload, less the row's own header).
const FTS_LEAF_BYTES: i64 = 960;
/// Schema version of this database (inside the store's layout 2). 1: the search index over
/// `messages.text` with FTS5's `unicode61` tokenizer; 2: over the folded words
/// (`fold.rs`), contentless, with the `ascii` tokenizer. A schema-1 database is re-indexed
/// at open, in one transaction (`reindex`).
const SCHEMA: i64 = 2;
/// The SQL function that gives the index a message's words (`fold::index_text`): every
/// connection that writes messages has it (`register_fold`).
const FOLD_FN: &str = "iris_fold";

const BASE_SQL: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    text TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_lane ON messages(chat_id, thread_id, seq);
CREATE TABLE IF NOT EXISTS media_uses(
    media_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (media_id, message_id)
) WITHOUT ROWID;
";

/// The search index (schema 2): contentless, so a removal needs only the row's position (not
/// the words it was indexed with, which a newer `fold` might make differently).
const SEARCH_SQL: &str = "
CREATE VIRTUAL TABLE IF NOT EXISTS search USING fts5(
    words, content='', contentless_delete=1, tokenize='ascii'
);
CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO search(rowid, words) VALUES (new.seq, iris_fold(new.text));
END;
CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
    DELETE FROM search WHERE rowid = old.seq;
END;
CREATE TRIGGER IF NOT EXISTS messages_au AFTER UPDATE OF text ON messages BEGIN
    DELETE FROM search WHERE rowid = old.seq;
    INSERT INTO search(rowid, words) VALUES (new.seq, iris_fold(new.text));
END;
";

/// What schema 1 had of the index, dropped by `reindex`.
const DROP_V1_SQL: &str = "
DROP TRIGGER IF EXISTS messages_ai;
DROP TRIGGER IF EXISTS messages_ad;
DROP TRIGGER IF EXISTS messages_au;
DROP TABLE IF EXISTS search;
";

/// Why SQLite failed, kept with its kind so a full or read-only disk gets its own message.
pub(super) fn sql_error(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        match f.code {
            ErrorCode::DiskFull => {
                return StoreError::Full {
                    detail: format!("the history database: {e}"),
                }
            }
            ErrorCode::ReadOnly => {
                return StoreError::ReadOnly {
                    detail: format!("the history database: {e}"),
                }
            }
            _ => {}
        }
    }
    if is_damage(&e) || is_bad_value(&e) {
        return StoreError::HistoryDamaged {
            detail: e.to_string(),
        };
    }
    StoreError::History(e)
}

/// Whether a stored value is not what the schema writes (a text that is not UTF-8, a number
/// where a text belongs): the gateway wrote none of these, so the file's content was damaged.
fn is_bad_value(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)
    )
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        sql_error(e)
    }
}

/// Whether SQLite's error means the file itself is damaged (not a refused write).
pub(super) fn is_damage(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase))
}

/// Whether SQLite's error is the storage failing (I/O, full, read-only), not a bad record.
pub(super) fn is_io(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, ErrorCode::SystemIoFailure | ErrorCode::DiskFull
            | ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::DatabaseBusy))
}

pub(super) fn history_path(dir: &Path) -> PathBuf {
    dir.join(HISTORY_DIR).join(HISTORY_FILE)
}

/// The database: the connection that writes (the journal's apply: on a worker after each sync,
/// on the query thread when a read finds the database behind; the few bounded reads that still
/// run on the event loop, `History::read`, use it too), one for checkpoints on a worker, and
/// the query thread with a read connection of its own. WAL lets that reader run beside the
/// writer: a query sees the last committed apply and never waits for the next.
pub(super) struct History {
    pub(super) conn: Mutex<Connection>,
    ckpt: Mutex<Connection>,
    /// The query thread's queue, first in first out; the thread ends when this is dropped.
    queries: Mutex<std::sync::mpsc::Sender<Job>>,
    /// `meta.applied` as last committed through this connection: every sync and every read of
    /// history asks for it, so it is kept here rather than read back each time.
    pub(super) applied: std::sync::atomic::AtomicU64,
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    // 1 KiB pages (takes effect when the database is created): a message's row and index
    // entries dirty fewer bytes per commit than with 4 KiB pages, which is what the SD card
    // is written per message.
    conn.pragma_update(None, "page_size", 1024)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // WAL + NORMAL: commits are not fsynced, checkpoints are (see the module comment).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Checkpoints run on the worker thread (`checkpoint`), never inside a commit on the event loop.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
    conn.pragma_update(None, "mmap_size", 0)?;
    // Deleted content is overwritten where it costs no extra page write; a transaction that
    // deletes messages switches to ON (`apply`), which also zeroes the pages it frees. FAST
    // keeps FTS5's merges of live postings from zeroing the pages they free on every insert.
    conn.pragma_update(None, "secure_delete", "FAST")?;
    conn.pragma_update(None, "journal_size_limit", 4 << 20)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(())
}

/// Gives `conn` the function the index triggers call (`FOLD_FN`).
fn register_fold(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        FOLD_FN,
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let text = ctx.get_raw(0).as_str().unwrap_or("");
            Ok(super::fold::index_text(text))
        },
    )
}

/// The index's own options, written only when they differ (a clean start on a read-only disk
/// writes nothing).
fn set_fts_options(conn: &Connection) -> rusqlite::Result<()> {
    let fts_option = |name: &str, want: i64| -> rusqlite::Result<()> {
        let now: Option<i64> = conn
            .query_row(
                "SELECT v FROM search_config WHERE k = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()?;
        if now != Some(want) {
            conn.execute(
                "INSERT INTO search(search, rank) VALUES (?1, ?2)",
                params![name, want],
            )?;
        }
        Ok(())
    };
    // Removed messages leave nothing in the index either (FTS5 otherwise keeps a delete
    // marker beside the old postings until the next merge).
    fts_option("secure-delete", 1)?;
    // Index leaves that fit in one 1 KiB database page: FTS5's default (4,050 bytes) spills
    // every merged leaf into overflow pages, four page writes where one does.
    fts_option("pgsz", FTS_LEAF_BYTES)
}

/// Schema 1 to 2: the index dropped and made again from every message's folded words, in one
/// transaction with the new schema number. A crash before its commit leaves schema 1 as it
/// was (SQLite rolls the transaction back), and the next open does it all again; after it,
/// schema 2 is complete. Its cost follows history (about a second per 20,000 messages here),
/// paid once, at start-up, before the gateway serves.
fn reindex(conn: &mut Connection) -> Result<()> {
    let started = std::time::Instant::now();
    let tx = conn.transaction()?;
    tx.execute_batch(DROP_V1_SQL)?;
    tx.execute_batch(SEARCH_SQL)?;
    set_fts_options(&tx)?;
    let n = tx.execute(
        "INSERT INTO search(rowid, words) SELECT seq, iris_fold(text) FROM messages",
        [],
    )?;
    if super::engine::kill_points::kill_hook().as_deref() == Some("reindex") {
        // Test hook: every row indexed, the commit not made (tests/search_fold.rs).
        super::engine::kill_points::kill_now();
    }
    tx.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'schema'",
        params![SCHEMA],
    )?;
    tx.commit()?;
    tracing::info!(
        messages = n,
        ms = started.elapsed().as_millis() as u64,
        "search index rebuilt with case folding (history schema 1 to 2)"
    );
    Ok(())
}

impl History {
    /// Opens the database at `path`; `create` allows making a new one (a fresh store, a
    /// migration, a restore), otherwise a missing file is an error.
    pub(super) fn open(path: &Path, create: bool) -> Result<History> {
        if create {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| StoreError::Open {
                    dir: parent.to_owned(),
                    source: sled::Error::Io(e),
                })?;
            }
        }
        let flags = if create {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
        } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags)?;
        configure(&conn)?;
        register_fold(&conn)?;
        conn.execute_batch(BASE_SQL)?;
        let schema: Option<i64> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()?;
        match schema {
            Some(1) => reindex(&mut conn)?,
            // Newer: `quick_look` says so, before anything is written.
            Some(n) if n > SCHEMA => {}
            _ => {
                conn.execute_batch(SEARCH_SQL)?;
                set_fts_options(&conn)?;
            }
        }
        conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?1), ('applied', 0)",
            params![SCHEMA],
        )?;
        let ckpt = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        configure(&ckpt)?;
        // It only copies the WAL into the database: it needs next to no cache of its own.
        ckpt.pragma_update(None, "cache_size", -64)?;
        let applied: i64 =
            conn.query_row("SELECT value FROM meta WHERE key = 'applied'", [], |r| {
                r.get(0)
            })?;
        let queries = spawn_query_thread(path)?;
        Ok(History {
            conn: Mutex::new(conn),
            ckpt: Mutex::new(ckpt),
            queries: Mutex::new(queries),
            applied: (applied as u64).into(),
        })
    }

    /// Queues a read for the query thread. `Closed` if the thread is gone (it never ends while
    /// the database is open, unless a query panicked).
    pub(super) fn run(&self, job: Job) -> Result<()> {
        self.queries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(job)
            .map_err(|_| StoreError::Closed("the history query thread has stopped".into()))
    }

    /// A read through the writing connection, on this thread (tools, tests, start-up).
    pub(super) fn read<T>(&self, f: impl FnOnce(&Query<'_>) -> T) -> T {
        f(&Query { c: &self.c() })
    }

    pub(super) fn c(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The journal position applied so far.
    pub(super) fn applied(&self) -> Result<u64> {
        Ok(self.applied.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A bounded look at the database: its schema, its meta rows, and the newest messages
    /// read back. SQLite's own recovery (of the WAL) has run by then.
    pub(super) fn quick_look(&self) -> std::result::Result<u64, String> {
        let c = self.c();
        let schema: i64 = c
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .map_err(|e| format!("its meta table cannot be read ({e})"))?;
        if schema > SCHEMA {
            return Err(format!(
                "it was written by a newer iris-gateway (schema {schema})"
            ));
        }
        let applied: i64 = c
            .query_row("SELECT value FROM meta WHERE key = 'applied'", [], |r| {
                r.get(0)
            })
            .map_err(|e| format!("its meta table cannot be read ({e})"))?;
        let mut stmt = c
            .prepare("SELECT text, body FROM messages ORDER BY seq DESC LIMIT 64")
            .map_err(|e| format!("its messages cannot be read ({e})"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| format!("its newest messages cannot be read ({e})"))?;
        for row in rows {
            let (text, body) =
                row.map_err(|e| format!("its newest messages cannot be read ({e})"))?;
            message_of(text, &body).map_err(|e| e.to_string())?;
        }
        // One lookup in the index (a term nobody writes): reads its structure, not its size.
        c.query_row(
            "SELECT rowid FROM search WHERE search MATCH 'qqzxjqq' LIMIT 1",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(|e| format!("its search index cannot be read ({e})"))?;
        Ok(applied as u64)
    }

    /// Writes everything to the database file and fsyncs it, then empties the WAL; returns the
    /// journal position that is now durable, or `None` if a reader kept part of the WAL.
    /// Blocking: call it from a worker thread (or at shutdown).
    pub(super) fn checkpoint(&self) -> Result<Option<u64>> {
        let c = self
            .ckpt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Read before the checkpoint: everything committed so far is covered by it.
        let applied: i64 =
            c.query_row("SELECT value FROM meta WHERE key = 'applied'", [], |r| {
                r.get(0)
            })?;
        let (busy, log, done): (i64, i64, i64) =
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        Ok((busy == 0 && log == done).then_some(applied as u64))
    }

    pub(super) fn is_used(&self, media_id: &str) -> Result<bool> {
        let c = self.c();
        let mut stmt = c.prepare_cached("SELECT 1 FROM media_uses WHERE media_id = ?1 LIMIT 1")?;
        Ok(stmt.exists(params![media_id])?)
    }

    /// Every message in position order, and every media use, for a backup: read in one
    /// transaction, so they agree with each other and with `applied`.
    pub(super) fn export(
        &self,
        mut message: impl FnMut(&Lane, u64, &HistoryMessage) -> Result<()>,
        mut media_use: impl FnMut(&str, &str) -> Result<()>,
    ) -> Result<u64> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let applied: i64 =
            tx.query_row("SELECT value FROM meta WHERE key = 'applied'", [], |r| {
                r.get(0)
            })?;
        {
            let mut stmt = tx
                .prepare("SELECT chat_id, thread_id, seq, text, body FROM messages ORDER BY seq")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let lane = lane_of(r.get(0)?, r.get(1)?);
                let m = message_of(r.get(3)?, &r.get::<_, String>(4)?)?;
                message(&lane, r.get::<_, i64>(2)? as u64, &m)?;
            }
            let mut stmt = tx.prepare("SELECT media_id, message_id FROM media_uses")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                media_use(&r.get::<_, String>(0)?, &r.get::<_, String>(1)?)?;
            }
        }
        tx.commit()?;
        Ok(applied as u64)
    }

    /// How many messages are stored: for the benchmarks (a full count, not for serving).
    pub(super) fn count(&self) -> Result<u64> {
        let n: i64 = self
            .c()
            .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Role;
    use crate::store::sql_write::{body_of, Op};

    fn msg(id: &str, text: &str) -> HistoryMessage {
        HistoryMessage::text_only(id.into(), Role::User, text.into(), 1)
    }

    /// Terms left in the index (FTS5's vocabulary), not what a query can still match.
    fn indexed_terms(h: &History) -> Vec<String> {
        let c = h.c();
        c.execute_batch(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.v USING fts5vocab(main, search, 'row')",
        )
        .unwrap();
        let mut stmt = c.prepare("SELECT term FROM temp.v ORDER BY term").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn a_deleted_message_leaves_no_term_in_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(&dir.path().join("h.sqlite3"), true).unwrap();
        let lane = Lane::new("default", None);
        h.apply(&[
            (
                1,
                Op::Put {
                    lane: lane.clone(),
                    message: msg("a", "secret pumpkin plans"),
                },
            ),
            (
                2,
                Op::Put {
                    lane: lane.clone(),
                    message: msg("b", "plain carrots"),
                },
            ),
        ])
        .unwrap();
        assert!(indexed_terms(&h).contains(&"pumpkin".to_owned()));
        h.apply(&[(
            3,
            Op::Delete {
                message_id: "a".into(),
            },
        )])
        .unwrap();
        assert_eq!(indexed_terms(&h), ["carrots", "plain"]);
        assert_eq!(h.applied().unwrap(), 3);
        // Deleting what is gone is a no-op.
        h.apply(&[(
            3,
            Op::Delete {
                message_id: "a".into(),
            },
        )])
        .unwrap();
        assert!(h.read(|q| q.message("a")).unwrap().is_none());
        assert!(h.read(|q| q.message("b")).unwrap().is_some());
    }

    /// Schema 1 as iris-gateway 0.1 wrote it: the index over the raw text, `unicode61`.
    pub(crate) const V1_SQL: &str = "
    CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE messages(seq INTEGER PRIMARY KEY, message_id TEXT NOT NULL UNIQUE,
        chat_id TEXT NOT NULL, thread_id TEXT NOT NULL, text TEXT NOT NULL, body TEXT NOT NULL);
    CREATE INDEX messages_lane ON messages(chat_id, thread_id, seq);
    CREATE VIRTUAL TABLE search USING fts5(text, content='messages', content_rowid='seq',
        tokenize='unicode61 remove_diacritics 0', columnsize=0);
    CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO search(rowid, text) VALUES (new.seq, new.text); END;
    CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO search(search, rowid, text) VALUES ('delete', old.seq, old.text); END;
    CREATE TABLE media_uses(media_id TEXT NOT NULL, message_id TEXT NOT NULL,
        PRIMARY KEY (media_id, message_id)) WITHOUT ROWID;
    INSERT INTO meta VALUES ('schema', 1), ('applied', 0);
    ";

    fn found(h: &History, fts: &str) -> Vec<String> {
        let mut ids = Vec::new();
        h.read(|q| {
            q.search(fts, (None, None), 100, |_, m| {
                ids.push(m.message_id);
                Ok(false)
            })
        })
        .unwrap();
        ids
    }

    #[test]
    fn a_schema_1_index_is_rebuilt_folded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite3");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(V1_SQL).unwrap();
            for (i, text) in ["ΣΑΣ ευχαριστώ", "İstanbul trip", "cafe\u{301} au lait"]
                .iter()
                .enumerate()
            {
                let m = msg(&format!("m{i}"), text);
                c.execute(
                    "INSERT INTO messages(message_id, chat_id, thread_id, text, body)
                     VALUES (?1, 'default', '', ?2, ?3)",
                    params![m.message_id, m.text, body_of(&m)],
                )
                .unwrap();
            }
        }
        let h = History::open(&path, false).unwrap();
        assert_eq!(found(&h, "\"σασ\"*"), ["m0"]);
        assert_eq!(found(&h, "\"istanbul\"*"), ["m1"]);
        assert_eq!(found(&h, "\"caf\u{e9}\"*"), ["m2"]);
        assert_eq!(h.quick_look().unwrap(), 0);
        // Deleting after the rebuild leaves nothing behind; opening again changes nothing.
        h.apply(&[(
            1,
            Op::Delete {
                message_id: "m1".into(),
            },
        )])
        .unwrap();
        drop(h);
        let h = History::open(&path, false).unwrap();
        assert!(found(&h, "\"istanbul\"*").is_empty());
        assert_eq!(found(&h, "\"σασ\"*"), ["m0"]);
    }
}
