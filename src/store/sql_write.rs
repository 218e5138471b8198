//! Every write of the history database: a journal entry applied (`Op`, what the journal in
//! sled carries), and the bulk import of a migration or a restore.

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::base::Result;
use super::sql::History;
use super::sql_query::{message_of, Query};
use crate::protocol::{HistoryMessage, Lane};

/// One change to history, as the journal carries it. Built and dropped one at a time, so
/// the size difference between its variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Op {
    Put {
        lane: Lane,
        message: HistoryMessage,
    },
    Delete {
        message_id: String,
    },
    /// Every message of a channel (all its lanes) or of one thread.
    Purge {
        chat_id: String,
        thread_id: Option<String>,
    },
}

/// The stored body: the message without its text (kept in its own column, which search reads).
pub(super) fn body_of(m: &HistoryMessage) -> String {
    let mut m = m.clone();
    m.text = String::new();
    serde_json::to_string(&m).expect("history messages serialise")
}

impl History {
    /// Applies journal entries (position, op) in one transaction, with the new position.
    /// Entries at or below what is applied already are skipped: two threads may apply at once
    /// (the committer's worker and the query thread catching up), and the one that comes second
    /// with an older batch must neither apply it again nor move `applied` back.
    pub(super) fn apply(&self, ops: &[(u64, Op)]) -> Result<()> {
        let mut c = self.c();
        let done = self.applied.load(std::sync::atomic::Ordering::SeqCst);
        let ops = &ops[ops.partition_point(|(p, _)| *p <= done)..];
        let Some(last) = ops.last().map(|(p, _)| *p) else {
            return Ok(());
        };
        let deletes = ops
            .iter()
            .any(|(_, op)| matches!(op, Op::Delete { .. } | Op::Purge { .. }));
        if deletes {
            c.pragma_update(None, "secure_delete", "ON")?;
        }
        let result = (|| {
            let tx = c.transaction()?;
            for (_, op) in ops {
                apply_op(&tx, op)?;
            }
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'applied'",
                params![last as i64],
            )?;
            tx.commit()?;
            self.applied
                .store(last, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })();
        if deletes {
            c.pragma_update(None, "secure_delete", "FAST")?;
        }
        result
    }

    /// `f` over the database as it would be with `ops` applied, keeping none of them: they are
    /// applied in a transaction that `f` reads and that is then rolled back. For reads while
    /// the journal cannot be applied (a full or read-only disk): with `cache_spill` off the
    /// transaction's pages stay in SQLite's page cache (at most `APPLY_BATCH` entries' worth),
    /// so nothing reaches the disk.
    pub(super) fn read_with<T>(
        &self,
        ops: &[(u64, Op)],
        f: impl FnOnce(&Query<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut c = self.c();
        let done = self.applied.load(std::sync::atomic::Ordering::SeqCst);
        let ops = &ops[ops.partition_point(|(p, _)| *p <= done)..];
        c.pragma_update(None, "cache_spill", false)?;
        let out = (|| {
            let tx = c.transaction()?;
            for (_, op) in ops {
                apply_op(&tx, op)?;
            }
            let out = f(&Query { c: &tx });
            tx.rollback()?;
            out
        })();
        c.pragma_update(None, "cache_spill", true)?;
        out
    }

    /// Inserts messages with their original positions (migration, restore), in one transaction.
    pub(super) fn import(
        &self,
        rows: &[(Lane, u64, HistoryMessage)],
        uses: &[(String, String)],
    ) -> Result<()> {
        let mut c = self.c();
        let tx = c.transaction()?;
        {
            let mut ins = tx.prepare_cached(
                "INSERT OR REPLACE INTO messages(seq, message_id, chat_id, thread_id, text, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (lane, seq, m) in rows {
                ins.execute(params![
                    *seq as i64,
                    m.message_id,
                    lane.chat_id,
                    lane.thread_id.as_deref().unwrap_or(""),
                    m.text,
                    body_of(m)
                ])?;
            }
            let mut use_ins =
                tx.prepare_cached("INSERT OR IGNORE INTO media_uses VALUES (?1, ?2)")?;
            for (media, message) in uses {
                use_ins.execute(params![media, message])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub(super) fn set_applied(&self, applied: u64) -> Result<()> {
        self.c().execute(
            "UPDATE meta SET value = ?1 WHERE key = 'applied'",
            params![applied as i64],
        )?;
        self.applied
            .store(applied, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

fn apply_op(tx: &rusqlite::Transaction<'_>, op: &Op) -> Result<()> {
    match op {
        Op::Put { lane, message } => {
            // A replaced message keeps its first position (and lane).
            tx.prepare_cached(
                "INSERT INTO messages(message_id, chat_id, thread_id, text, body)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(message_id) DO UPDATE SET text = excluded.text, body = excluded.body",
            )?
            .execute(params![
                message.message_id,
                lane.chat_id,
                lane.thread_id.as_deref().unwrap_or(""),
                message.text,
                body_of(message)
            ])?;
            let mut uses = tx.prepare_cached("INSERT OR IGNORE INTO media_uses VALUES (?1, ?2)")?;
            for m in &message.media {
                uses.execute(params![m.media_id, message.message_id])?;
            }
        }
        Op::Delete { message_id } => delete_one(tx, message_id)?,
        Op::Purge { chat_id, thread_id } => {
            let ids: Vec<String> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT message_id FROM messages WHERE chat_id = ?1
                     AND (?2 IS NULL OR thread_id = ?2)",
                )?;
                let rows = stmt.query_map(params![chat_id, thread_id], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for id in ids {
                delete_one(tx, &id)?;
            }
        }
    }
    Ok(())
}

fn delete_one(tx: &rusqlite::Transaction<'_>, message_id: &str) -> Result<()> {
    let body: Option<(String, String)> = tx
        .prepare_cached("SELECT text, body FROM messages WHERE message_id = ?1")?
        .query_row(params![message_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((text, body)) = body else {
        return Ok(());
    };
    if let Ok(m) = message_of(text, &body) {
        let mut del =
            tx.prepare_cached("DELETE FROM media_uses WHERE media_id = ?1 AND message_id = ?2")?;
        for r in &m.media {
            del.execute(params![r.media_id, message_id])?;
        }
    }
    tx.prepare_cached("DELETE FROM messages WHERE message_id = ?1")?
        .execute(params![message_id])?;
    Ok(())
}
