//! The history database's query thread: its own read-only connection (WAL lets it read beside
//! the writer), fed first in first out, and the reads it runs (`Query`).

use std::path::Path;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::base::{Result, StoreError};
use crate::protocol::{HistoryMessage, Lane};

/// A read of the history database, handed to its query thread.
pub(super) type Job = Box<dyn FnOnce(&Query<'_>) + Send>;

/// Page cache of the query thread's connection.
const QUERY_CACHE_KIB: i64 = 1024;

/// Starts the query thread with its read-only connection to `path`.
pub(super) fn spawn_query_thread(path: &Path) -> Result<std::sync::mpsc::Sender<Job>> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "cache_size", -QUERY_CACHE_KIB)?;
    conn.pragma_update(None, "mmap_size", 0)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(16);
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("history-query".into())
        .spawn(move || {
            let q = Query { c: &conn };
            for job in rx {
                job(&q);
            }
        })
        .map_err(|e| StoreError::Closed(format!("cannot start the history query thread: {e}")))?;
    Ok(tx)
}

pub(super) fn lane_of(chat: String, thread: String) -> Lane {
    Lane {
        chat_id: chat,
        thread_id: (!thread.is_empty()).then_some(thread),
    }
}

/// What a history row whose JSON does not parse is called in `StoreError::Corrupt`.
pub(super) const HISTORY_MESSAGE: &str = "history message";

pub(super) fn message_of(text: String, body: &str) -> Result<HistoryMessage> {
    let mut m: HistoryMessage =
        serde_json::from_str(body).map_err(|source| StoreError::Corrupt {
            what: HISTORY_MESSAGE,
            source,
        })?;
    m.text = text;
    Ok(m)
}

/// Reads of the history database through one connection: the query thread's, or the
/// writer's (`History::read`).
pub(super) struct Query<'a> {
    pub(super) c: &'a Connection,
}

impl Query<'_> {
    /// Up to `limit + 1` messages of the lane before position `before`, newest first.
    pub(super) fn page(
        &self,
        lane: &Lane,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<HistoryMessage>> {
        let c = self.c;
        let mut stmt = c.prepare_cached(
            "SELECT text, body FROM messages WHERE chat_id = ?1 AND thread_id = ?2 AND seq < ?3
             ORDER BY seq DESC LIMIT ?4",
        )?;
        let rows = stmt.query_map(
            params![
                lane.chat_id,
                lane.thread_id.as_deref().unwrap_or(""),
                before.map(|b| b as i64).unwrap_or(i64::MAX),
                (limit + 1) as i64
            ],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )?;
        let mut out = Vec::with_capacity(limit + 1);
        for row in rows {
            let (text, body) = row?;
            out.push(message_of(text, &body)?);
        }
        Ok(out)
    }

    /// A message's lane and position.
    pub(super) fn locate(&self, message_id: &str) -> Result<Option<(Lane, u64)>> {
        let c = self.c;
        let mut stmt =
            c.prepare_cached("SELECT chat_id, thread_id, seq FROM messages WHERE message_id = ?1")?;
        Ok(stmt
            .query_row(params![message_id], |r| {
                Ok((lane_of(r.get(0)?, r.get(1)?), r.get::<_, i64>(2)? as u64))
            })
            .optional()?)
    }

    pub(super) fn message(&self, message_id: &str) -> Result<Option<(Lane, HistoryMessage)>> {
        let c = self.c;
        let mut stmt = c.prepare_cached(
            "SELECT chat_id, thread_id, text, body FROM messages WHERE message_id = ?1",
        )?;
        let row = stmt
            .query_row(params![message_id], |r| {
                Ok((
                    lane_of(r.get(0)?, r.get(1)?),
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .optional()?;
        match row {
            Some((lane, text, body)) => Ok(Some((lane, message_of(text, &body)?))),
            None => Ok(None),
        }
    }

    /// The ids and media of every message of a channel (all lanes) or of one thread.
    pub(super) fn lane_messages(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<HistoryMessage>> {
        let c = self.c;
        let mut stmt = c.prepare_cached(
            "SELECT text, body FROM messages WHERE chat_id = ?1 AND (?2 IS NULL OR thread_id = ?2)
             ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![chat_id, thread_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (text, body) = row?;
            out.push(message_of(text, &body)?);
        }
        Ok(out)
    }

    /// Runs an FTS5 query newest first, handing each match to `visit` until it returns true or
    /// `max_scanned` matches were looked at.
    pub(super) fn search(
        &self,
        fts_query: &str,
        scope: (Option<&str>, Option<&str>),
        max_scanned: usize,
        mut visit: impl FnMut(Lane, HistoryMessage) -> Result<bool>,
    ) -> Result<()> {
        let c = self.c;
        let mut stmt = c.prepare_cached(
            "SELECT m.chat_id, m.thread_id, m.text, m.body FROM search
             JOIN messages m ON m.seq = search.rowid
             WHERE search MATCH ?1 AND (?3 IS NULL OR m.chat_id = ?3)
             AND (?4 IS NULL OR m.thread_id = ?4)
             ORDER BY search.rowid DESC LIMIT ?2",
        )?;
        let mut rows = stmt.query(params![fts_query, max_scanned as i64, scope.0, scope.1])?;
        while let Some(r) = rows.next()? {
            let lane = lane_of(r.get(0)?, r.get(1)?);
            let m = message_of(r.get(2)?, &r.get::<_, String>(3)?)?;
            if visit(lane, m)? {
                break;
            }
        }
        Ok(())
    }
}
