//! `Store::commit`: a change list made atomic with one sled record instead of a sled
//! transaction.
//!
//! A sled 0.34 transaction costs three log writes, each with its own `sync_file_range`: it
//! rolls the log buffer (writing whatever waited in it), writes its 24-byte batch manifest on
//! its own, and only then the transaction's data. On an SD card every one of those rewrites
//! the same 4 KiB block; at three commits a turn that was nine block writes for what a plain
//! file does in three (docs/storage.md, "SD-card wear").
//!
//! What replaces it rests on how sled recovers: it replays its log in order and stops at the
//! first torn record, so what survives a crash is always a prefix of the writes, in the order
//! one thread made them. A commit therefore writes, in this order:
//!
//! 1. the entries under new keys: outbox frames at the next cursors, `frame_of` for them,
//!    journal entries at the next positions. Until step 2 they are past the recorded heads,
//!    and nothing reads past the heads;
//! 2. the commit record (`meta/commit`): the new heads and the *redo* list, every change to a
//!    key that already exists (a message's frame list, tombstones, channels, pending turns).
//!    This one insert is the commit point;
//! 3. the redo list applied.
//!
//! After a crash, `recover` cuts what step 1 left past the heads (a commit whose record never
//! reached the disk: no device was told of it) and applies the last record's redo list again:
//! each redo is idempotent, and a record that survived implies every write before it did. All
//! three steps go into the same log buffer, so `Store::sync` writes them with one write and
//! one `sync_file_range`.

use serde::{Deserialize, Serialize};

use super::handle::{Heads, Sled, Store};
use crate::protocol::{Channel, Lane};
use crate::store::base::{to_json, u64_from, Result};
use crate::store::change::Change;
use crate::store::lane_models::{LaneModel, VoiceMode};
use crate::store::read_marks::ReadMark;
use crate::store::records::Record;
use crate::store::sql_write;
use crate::store::turns::PendingTurn;

/// The commit record's key in `meta` (layout 3).
pub(in crate::store) const META_COMMIT: &[u8] = b"commit";
/// Layout 2's separate heads, read once by the upgrade to layout 3.
pub(in crate::store) const META_CURSOR_V2: &[u8] = b"cursor_head";
pub(in crate::store) const META_JOURNAL_V2: &[u8] = b"journal_head";

/// The commit point of the last commit: its heads and what it changed under existing keys.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CommitRecord {
    heads: Heads,
    redo: Vec<Redo>,
}

/// A change to a key that existed before the commit: replayed by `recover` when the record is
/// the last one, so each must give the same result when applied twice.
#[derive(Debug, Serialize, Deserialize)]
enum Redo {
    /// The frame at `cursor` carries `message_id`'s content (its list in `message_frames`).
    FrameOf {
        message_id: String,
        cursor: u64,
    },
    /// The message is deleted: its frames still in the outbox become `tombstone`, its pending
    /// turn (if any) goes.
    Delete {
        message_id: String,
        tombstone: String,
    },
    PutChannel(Channel),
    DeleteChannel(String),
    BeginTurn(PendingTurn),
    EndTurn(String),
    PutReadMark(Lane, ReadMark),
    SetLaneModel(Lane, Option<LaneModel>),
    SetLaneVoice(Lane, Option<VoiceMode>),
    Record(Record),
}

/// sled's error from a commit step, kept with its kind (a full disk stays `Full`).
type SledResult<T> = std::result::Result<T, sled::Error>;

impl Store {
    /// Applies `changes` atomically and returns the cursors assigned to its outbox frames, in
    /// order. Not yet durable: call `sync` before telling anyone.
    pub fn commit(&self, changes: &[Change]) -> Result<Vec<u64>> {
        let bytes = changes.iter().map(Change::approx_bytes).sum();
        self.writable_for(bytes)?;
        let t = self.t()?;
        // Held through the three steps: commits are ordered as their records are.
        let mut heads = t
            .heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (record, cursors) = self.note_failure(new_entries(&t, *heads, changes))?;
        self.kill_at_commit("before-commit-record", &t, &cursors);
        self.note_failure(t.meta.insert(META_COMMIT, to_json(&record)))?;
        *heads = record.heads;
        self.kill_at_commit("after-commit-record", &t, &cursors);
        // Each change writes one to three sled records, the record one more: roughly what a
        // start after a crash would replay (`Store::bound_replay`).
        self.replay_bound()
            .committed(2 * changes.len() as u64 + 1, bytes);
        for redo in &record.redo {
            // The commit stands (its record is written); a failure here is the disk's, and
            // sled refuses every later write until the store is reopened, which replays this.
            self.note_failure(apply(&t, redo))?;
        }
        Ok(cursors)
    }

    /// Test hooks `IRIS_GATEWAY_KILL_AT=before-commit-record` and `after-commit-record`: at the
    /// first commit with outbox frames, makes everything written so far durable and dies, as
    /// if the power went right there with sled's background flush just done.
    fn kill_at_commit(&self, point: &str, t: &Sled, cursors: &[u64]) {
        if self.shared.kill_at.as_deref() == Some(point) && !cursors.is_empty() {
            let _ = t.db.flush();
            super::kill_points::kill_now();
        }
    }
}

/// The commit record that moves the cursor head up to `cursor` and changes nothing else, for
/// a batch that writes it with what explains the jump (`Store::raise_cursor_head`). Nothing to
/// redo: the record it replaces was applied when the store opened.
pub(in crate::store) fn raised_record(heads: Heads, cursor: u64) -> (Heads, Vec<u8>) {
    let heads = Heads {
        cursor: cursor.max(heads.cursor),
        journal: heads.journal,
    };
    let record = CommitRecord {
        heads,
        redo: Vec::new(),
    };
    (heads, to_json(&record))
}

/// How many media records share the bytes `sha`: as this commit left it so far, else as stored.
fn blob_count(
    t: &Sled,
    in_commit: &std::collections::HashMap<String, u64>,
    sha: &str,
) -> SledResult<u64> {
    match in_commit.get(sha) {
        Some(n) => Ok(*n),
        None => Ok(t.blobs.get(sha.as_bytes())?.map_or(0, |v| u64_from(&v))),
    }
}

/// Step 1: the entries under new keys, and the record that will make them count.
fn new_entries(
    t: &Sled,
    before: Heads,
    changes: &[Change],
) -> SledResult<(CommitRecord, Vec<u64>)> {
    let mut heads = before;
    let mut redo = Vec::new();
    let mut cursors = Vec::new();
    // Blob counts as this commit leaves them: two records of one file in a commit count twice.
    let mut blobs: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let log = |heads: &mut Heads, op: sql_write::Op| -> SledResult<()> {
        heads.journal += 1;
        t.journal
            .insert(heads.journal.to_be_bytes(), to_json(&op))
            .map(|_| ())
    };
    for change in changes {
        match change {
            Change::Outbox(frame) => {
                heads.cursor += 1;
                t.outbox
                    .insert(heads.cursor.to_be_bytes(), frame.as_ref())?;
                cursors.push(heads.cursor);
            }
            Change::OutboxOf { message_id, frame } => {
                heads.cursor += 1;
                let key = heads.cursor.to_be_bytes();
                t.outbox.insert(key, frame.as_ref())?;
                t.frame_of.insert(key, message_id.as_bytes())?;
                cursors.push(heads.cursor);
                redo.push(Redo::FrameOf {
                    message_id: message_id.clone(),
                    cursor: heads.cursor,
                });
            }
            Change::PutMessage(lane, msg) => log(
                &mut heads,
                sql_write::Op::Put {
                    lane: lane.clone(),
                    message: msg.clone(),
                },
            )?,
            Change::PurgeHistory { chat_id, thread_id } => log(
                &mut heads,
                sql_write::Op::Purge {
                    chat_id: chat_id.clone(),
                    thread_id: thread_id.clone(),
                },
            )?,
            Change::DeleteMessage {
                message_id,
                tombstone,
            } => {
                log(
                    &mut heads,
                    sql_write::Op::Delete {
                        message_id: message_id.clone(),
                    },
                )?;
                redo.push(Redo::Delete {
                    message_id: message_id.clone(),
                    tombstone: String::from_utf8_lossy(tombstone).into_owned(),
                });
            }
            Change::PutChannel(ch) => redo.push(Redo::PutChannel(ch.clone())),
            Change::DeleteChannel(id) => redo.push(Redo::DeleteChannel(id.clone())),
            Change::BeginTurn(turn) => redo.push(Redo::BeginTurn(turn.clone())),
            Change::EndTurn(id) => redo.push(Redo::EndTurn(id.clone())),
            Change::MarkRead(lane, mark) => {
                redo.push(Redo::PutReadMark(lane.clone(), mark.clone()))
            }
            Change::SetLaneModel(lane, model) => {
                redo.push(Redo::SetLaneModel(lane.clone(), model.clone()))
            }
            Change::SetLaneVoice(lane, mode) => redo.push(Redo::SetLaneVoice(lane.clone(), *mode)),
            Change::Record(r) => redo.push(Redo::Record(r.clone())),
            Change::AddMedia {
                record,
                device_id,
                media_ref,
            } => {
                let count = blob_count(t, &blobs, &record.sha256)? + 1;
                blobs.insert(record.sha256.clone(), count);
                redo.push(Redo::Record(Record::PutMedia {
                    record: record.clone(),
                    device_ref: (!device_id.is_empty())
                        .then(|| (device_id.clone(), media_ref.clone())),
                    blob_count: count,
                }));
            }
            Change::RemoveMedia(media_id) => {
                let record = t.media.get(media_id.as_bytes())?.and_then(|v| {
                    serde_json::from_slice::<crate::store::media::MediaRecord>(&v).ok()
                });
                if let Some(record) = record {
                    let count = blob_count(t, &blobs, &record.sha256)?.saturating_sub(1);
                    blobs.insert(record.sha256.clone(), count);
                    redo.push(Redo::Record(Record::DropMedia {
                        media_id: media_id.clone(),
                        sha256: record.sha256,
                        blob_count: count,
                    }));
                }
            }
        }
    }
    Ok((CommitRecord { heads, redo }, cursors))
}

/// Step 3 for one change, writing only what differs: applied twice, it writes nothing the
/// second time (so a clean start on a read-only disk writes nothing either).
fn apply(t: &Sled, redo: &Redo) -> SledResult<()> {
    match redo {
        Redo::FrameOf { message_id, cursor } => {
            let key = cursor.to_be_bytes();
            let mut list = t
                .message_frames
                .get(message_id.as_bytes())?
                .map(|v| v.to_vec())
                .unwrap_or_default();
            // Pruned since (replayed after the retention caught up with it): nothing to list.
            if list.chunks(8).any(|c| c == key) || t.outbox.get(key)?.is_none() {
                return Ok(());
            }
            list.extend_from_slice(&key);
            t.message_frames.insert(message_id.as_bytes(), list)?;
        }
        Redo::Delete {
            message_id,
            tombstone,
        } => {
            let id = message_id.as_bytes();
            if let Some(list) = t.message_frames.get(id)? {
                for c in list.chunks(8) {
                    if t.outbox.get(c)?.is_some_and(|v| v != tombstone.as_bytes()) {
                        t.outbox.insert(c, tombstone.as_bytes())?;
                    }
                    if t.frame_of.get(c)?.is_some() {
                        t.frame_of.remove(c)?;
                    }
                }
                t.message_frames.remove(id)?;
            }
            if t.turns.get(id)?.is_some() {
                t.turns.remove(id)?;
            }
        }
        Redo::PutChannel(ch) => {
            let value = to_json(ch);
            if t.channels.get(ch.chat_id.as_bytes())?.as_deref() != Some(&value[..]) {
                t.channels.insert(ch.chat_id.as_bytes(), value)?;
            }
        }
        Redo::DeleteChannel(id) => {
            if t.channels.get(id.as_bytes())?.is_some() {
                t.channels.remove(id.as_bytes())?;
            }
            // Its lanes' read markers, models and voice modes go with it (one per lane: short scans).
            for tree in [&t.read_marks, &t.lane_models, &t.lane_voices] {
                for item in tree.iter() {
                    let (k, _) = item?;
                    if crate::store::read_marks::in_entry(&k, id) {
                        tree.remove(k)?;
                    }
                }
            }
        }
        Redo::Record(r) => r.apply(t)?,
        Redo::SetLaneModel(lane, model) => {
            let key = crate::store::lane_models::key(lane);
            match model {
                Some(m) => {
                    let value = to_json(m);
                    if t.lane_models.get(&key)?.as_deref() != Some(&value[..]) {
                        t.lane_models.insert(key, value)?;
                    }
                }
                None => {
                    if t.lane_models.get(&key)?.is_some() {
                        t.lane_models.remove(key)?;
                    }
                }
            }
        }
        Redo::SetLaneVoice(lane, mode) => {
            let key = crate::store::lane_models::key(lane);
            match mode {
                Some(m) => {
                    let value = to_json(m);
                    if t.lane_voices.get(&key)?.as_deref() != Some(&value[..]) {
                        t.lane_voices.insert(key, value)?;
                    }
                }
                None => {
                    if t.lane_voices.get(&key)?.is_some() {
                        t.lane_voices.remove(key)?;
                    }
                }
            }
        }
        Redo::PutReadMark(lane, mark) => {
            let key = crate::store::read_marks::key(lane);
            let value = to_json(mark);
            if t.read_marks.get(&key)?.as_deref() != Some(&value[..]) {
                t.read_marks.insert(key, value)?;
            }
        }
        Redo::BeginTurn(turn) => {
            let value = to_json(turn);
            let key = turn.user_message_id.as_bytes();
            if t.turns.get(key)?.as_deref() != Some(&value[..]) {
                t.turns.insert(key, value)?;
            }
        }
        Redo::EndTurn(id) => {
            if t.turns.get(id.as_bytes())?.is_some() {
                t.turns.remove(id.as_bytes())?;
            }
        }
    }
    Ok(())
}

/// The heads as stored: the commit record's (layout 3), layout 2's two keys before the
/// upgrade, or nothing yet (a new store).
pub(in crate::store) fn load_heads(meta: &sled::Tree) -> Result<Heads> {
    if let Some(v) = meta.get(META_COMMIT)? {
        let record: CommitRecord = crate::store::base::from_json(&v, "commit record")?;
        return Ok(record.heads);
    }
    let read =
        |key: &[u8]| -> Result<u64> { Ok(meta.get(key)?.map(|v| u64_from(&v)).unwrap_or(0)) };
    Ok(Heads {
        cursor: read(META_CURSOR_V2)?,
        journal: read(META_JOURNAL_V2)?,
    })
}

/// After a crash: cuts what a commit wrote past the heads before its record was written, and
/// applies the last record's redo list again. Writes nothing when there is nothing to do.
pub(in crate::store) fn recover(t: &Sled) -> Result<()> {
    let Some(v) = t.meta.get(META_COMMIT)? else {
        return Ok(());
    };
    let record: CommitRecord = crate::store::base::from_json(&v, "commit record")?;
    let mut cut = 0u64;
    let after = |n: u64| (n + 1).to_be_bytes();
    for tree in [&t.outbox, &t.frame_of] {
        for item in tree.range(after(record.heads.cursor)..) {
            tree.remove(item?.0)?;
            cut += 1;
        }
    }
    for item in t.journal.range(after(record.heads.journal)..) {
        t.journal.remove(item?.0)?;
        cut += 1;
    }
    if cut > 0 {
        tracing::info!(
            entries = cut,
            "a commit cut short by a crash was dropped (no device had been told of it)"
        );
    }
    for redo in &record.redo {
        apply(t, redo)?;
    }
    Ok(())
}

/// Layout 2 → 3 (and the first record of a new store): the two heads become the commit record (with nothing to redo: layout 2
/// committed in sled transactions). The record goes first, so a crash before the layout
/// record changes leaves a layout-2 store whose heads are still where they were.
pub(in crate::store) fn upgrade_to_layout3(t: &Sled) -> Result<()> {
    let heads = load_heads(&t.meta)?;
    let record = CommitRecord {
        heads,
        redo: Vec::new(),
    };
    t.meta.insert(META_COMMIT, to_json(&record))?;
    super::kill_points::kill_point("layout3-record", Some(&t.db));
    t.meta
        .insert(crate::store::base::META_LAYOUT, &3u64.to_be_bytes())?;
    t.meta.remove(META_CURSOR_V2)?;
    t.meta.remove(META_JOURNAL_V2)?;
    t.db.flush()?;
    super::kill_points::kill_point("layout3-done", None);
    *t.heads
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = heads;
    if heads != Heads::default() {
        tracing::info!(
            cursor_head = heads.cursor,
            "store upgraded to layout 3 (commits without sled transactions)"
        );
    }
    Ok(())
}
