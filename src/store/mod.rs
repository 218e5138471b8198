//! Everything on disk, in sled. No other module touches sled.
//!
//! The store speaks in intents (append these frames to the outbox, keep this message, page this
//! lane) and owns the layout, documented in docs/storage.md. Writes that belong together go in
//! one sled transaction, so a power cut leaves either all of a change or none of it; `sync` makes
//! everything written so far durable (an fsync of sled's log) and is what the hub awaits before it
//! tells any device about a change.

mod devices;
mod directory;
mod history;
mod media;
mod outbox;
pub mod search;
mod sessions;
pub use sessions::AgentSession;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

pub use devices::{Device, DeviceOrigin};
pub use directory::DEFAULT_CHAT_ID;
pub use media::MediaRecord;

use crate::protocol::{Channel, HistoryMessage, Lane, TodoItem};

/// Layout version written at creation; a future layout change migrates from it on open.
const LAYOUT_VERSION: u64 = 1;
const META_LAYOUT: &[u8] = b"layout_version";
/// The last cursor ever assigned. Kept apart from the outbox so that pruning the outbox (or
/// deleting from it) can never make a cursor be reused after a restart.
const META_CURSOR: &[u8] = b"cursor_head";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the data directory {dir} is in use by another process (is the gateway already running?)"
    )]
    Locked { dir: PathBuf },
    #[error("cannot open the store in {dir}: {source}. The data may be damaged: restore a backup, or move the directory aside to start fresh")]
    Open { dir: PathBuf, source: sled::Error },
    #[error("storage error: {0}")]
    Sled(#[from] sled::Error),
    #[error("stored record is damaged ({what}): {source}")]
    Corrupt {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("store layout version {found} is newer than this build understands ({LAYOUT_VERSION}); upgrade iris-gateway")]
    TooNew { found: u64 },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// One change to persist. A `commit` applies a list of them atomically, in order.
#[derive(Debug, Clone)]
pub enum Change {
    /// Append an encoded frame to the outbox under the next cursor.
    Outbox(Bytes),
    /// Append a frame that carries (part of) a message's content: deleting the message later
    /// replaces this outbox entry with a tombstone, so no replay returns the content.
    OutboxOf {
        message_id: String,
        frame: Bytes,
    },
    /// Remove a message from history, the search index and the outbox (whose entries become
    /// `tombstone`, keeping cursors contiguous). Unknown ids are no-ops.
    DeleteMessage {
        message_id: String,
        tombstone: Bytes,
    },
    /// Insert or replace a message in its lane's history.
    PutMessage(Lane, HistoryMessage),
    PutChannel(Channel),
    DeleteChannel(String),
    /// Remember that a user message is waiting for its turn, so a restart can close it cleanly.
    BeginTurn(PendingTurn),
    EndTurn(String),
}

/// A user message whose agent turn has not finished yet.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PendingTurn {
    pub user_message_id: String,
    pub lane: Lane,
    pub text: String,
}

/// The sled database and its trees.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    meta: sled::Tree,
    outbox: sled::Tree,
    messages: sled::Tree,
    message_ids: sled::Tree,
    channels: sled::Tree,
    devices: sled::Tree,
    tokens: sled::Tree,
    todos: sled::Tree,
    /// Lane → its conversation at the agent (`sessions.rs`).
    sessions: sled::Tree,
    turns: sled::Tree,
    search_idx: sled::Tree,
    message_frames: sled::Tree,
    media: sled::Tree,
    media_refs: sled::Tree,
    media_uses: sled::Tree,
    blobs: sled::Tree,
}

impl Store {
    /// Opens (or creates) the store, waiting up to `lock_wait` for another process (a short-lived
    /// `pair` command) to let go of sled's lock.
    pub fn open(dir: &Path, cache_bytes: u64, lock_wait: Duration) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            dir: dir.to_owned(),
            source: e.into(),
        })?;
        let deadline = std::time::Instant::now() + lock_wait;
        let db = loop {
            let attempt = sled::Config::new()
                .path(dir.join("db"))
                .cache_capacity(cache_bytes)
                // The hub fsyncs explicitly before anything is announced; the background flush
                // only bounds what a crash can lose of writes nobody was told about.
                .flush_every_ms(Some(1000))
                .mode(sled::Mode::LowSpace)
                .open();
            match attempt {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if is_lock_error(&e) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Locked {
                            dir: dir.to_owned(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        dir: dir.to_owned(),
                        source,
                    })
                }
            }
        };
        let tree = |name: &str| db.open_tree(name);
        let store = Store {
            meta: tree("meta")?,
            outbox: tree("outbox")?,
            messages: tree("messages")?,
            message_ids: tree("message_ids")?,
            channels: tree("channels")?,
            devices: tree("devices")?,
            tokens: tree("tokens")?,
            todos: tree("todos")?,
            sessions: tree("sessions")?,
            turns: tree("turns")?,
            search_idx: tree("search")?,
            message_frames: tree("message_frames")?,
            media: tree("media")?,
            media_refs: tree("media_refs")?,
            media_uses: tree("media_uses")?,
            blobs: tree("blobs")?,
            db,
        };
        store.init_layout()?;
        Ok(store)
    }

    fn init_layout(&self) -> Result<()> {
        match self.meta.get(META_LAYOUT)? {
            Some(v) => {
                let found = u64_from(&v);
                if found > LAYOUT_VERSION {
                    return Err(StoreError::TooNew { found });
                }
            }
            None => {
                self.meta
                    .insert(META_LAYOUT, &LAYOUT_VERSION.to_be_bytes())?;
            }
        }
        self.ensure_default_channel()?;
        self.db.flush()?;
        Ok(())
    }

    /// The last cursor assigned (0 before the first frame).
    pub fn cursor_head(&self) -> Result<u64> {
        Ok(self
            .meta
            .get(META_CURSOR)?
            .map(|v| u64_from(&v))
            .unwrap_or(0))
    }

    /// Applies `changes` atomically and returns the cursors assigned to its outbox frames, in
    /// order. Not yet durable: call `sync` before telling anyone.
    pub fn commit(&self, changes: &[Change]) -> Result<Vec<u64>> {
        let trees = (
            &self.meta,
            &self.outbox,
            &self.messages,
            &self.message_ids,
            &self.channels,
            &self.turns,
            &self.search_idx,
            &self.message_frames,
            &self.media_uses,
        );
        let result = trees.transaction(
            |(meta, outbox, messages, ids, channels, turns, search_idx, frames, uses)| {
                let mut head = meta.get(META_CURSOR)?.map(|v| u64_from(&v)).unwrap_or(0);
                let mut cursors = Vec::new();
                for change in changes {
                    match change {
                        Change::Outbox(frame) => {
                            head += 1;
                            outbox.insert(&head.to_be_bytes(), frame.as_ref())?;
                            cursors.push(head);
                        }
                        Change::OutboxOf { message_id, frame } => {
                            head += 1;
                            outbox.insert(&head.to_be_bytes(), frame.as_ref())?;
                            cursors.push(head);
                            let mut list = frames
                                .get(message_id.as_bytes())?
                                .map(|v| v.to_vec())
                                .unwrap_or_default();
                            list.extend_from_slice(&head.to_be_bytes());
                            frames.insert(message_id.as_bytes(), list)?;
                        }
                        Change::PutMessage(lane, msg) => {
                            // A message keeps its first position in the lane when replaced.
                            let key = match ids.get(msg.message_id.as_bytes())? {
                                Some(k) => {
                                    if let Some(old) = messages.get(&k)? {
                                        if let Ok(old) =
                                            serde_json::from_slice::<HistoryMessage>(&old)
                                        {
                                            search::index_message(search_idx, &k, &old.text, true)?;
                                        }
                                    }
                                    k.to_vec()
                                }
                                None => history::message_key(lane, meta.generate_id()?),
                            };
                            messages.insert(key.as_slice(), to_json(msg).as_slice())?;
                            ids.insert(msg.message_id.as_bytes(), key.as_slice())?;
                            search::index_message(search_idx, &key, &msg.text, false)?;
                            for m in &msg.media {
                                uses.insert(media::use_key(&m.media_id, &msg.message_id), &[])?;
                            }
                        }
                        Change::DeleteMessage {
                            message_id,
                            tombstone,
                        } => {
                            let id = message_id.as_bytes();
                            if let Some(key) = ids.get(id)? {
                                if let Some(old) = messages.get(&key)? {
                                    if let Ok(old) = serde_json::from_slice::<HistoryMessage>(&old)
                                    {
                                        search::index_message(search_idx, &key, &old.text, true)?;
                                        for m in &old.media {
                                            uses.remove(media::use_key(&m.media_id, message_id))?;
                                        }
                                    }
                                }
                                messages.remove(&key)?;
                                ids.remove(id)?;
                            }
                            if let Some(list) = frames.get(id)? {
                                for c in list.chunks(8) {
                                    if outbox.get(c)?.is_some() {
                                        outbox.insert(c, tombstone.as_ref())?;
                                    }
                                }
                                frames.remove(id)?;
                            }
                            turns.remove(id)?;
                        }
                        Change::PutChannel(ch) => {
                            channels.insert(ch.chat_id.as_bytes(), to_json(ch).as_slice())?;
                        }
                        Change::DeleteChannel(chat_id) => {
                            channels.remove(chat_id.as_bytes())?;
                        }
                        Change::BeginTurn(t) => {
                            turns.insert(t.user_message_id.as_bytes(), to_json(t).as_slice())?;
                        }
                        Change::EndTurn(id) => {
                            turns.remove(id.as_bytes())?;
                        }
                    }
                }
                meta.insert(META_CURSOR, &head.to_be_bytes())?;
                Ok::<_, ConflictableTransactionError<StoreError>>(cursors)
            },
        );
        match result {
            Ok(c) => Ok(c),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }

    /// Makes every write so far durable. Runs sled's fsync on sled's own thread pool, so the
    /// event loop keeps serving while the SD card catches up.
    pub async fn sync(&self) -> Result<()> {
        self.db.flush_async().await?;
        Ok(())
    }

    /// Blocking variant for shutdown and the command-line tools.
    pub fn sync_blocking(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// Saves a lane's todo list. Not awaited for durability: `todo.update` is ephemeral, the
    /// saved copy only lets a restarted gateway give a better snapshot than none.
    pub fn put_todos(&self, lane: &Lane, todos: &[TodoItem]) -> Result<()> {
        let key = history::lane_prefix(lane);
        if todos.is_empty() {
            self.todos.remove(key)?;
        } else {
            self.todos.insert(key, to_json(&todos))?;
        }
        Ok(())
    }

    pub fn all_todos(&self) -> Result<Vec<(Lane, Vec<TodoItem>)>> {
        let mut out = Vec::new();
        for item in self.todos.iter() {
            let (k, v) = item?;
            if let Some(lane) = history::lane_from_prefix(&k) {
                out.push((lane, from_json(&v, "todo list")?));
            }
        }
        Ok(out)
    }

    /// User messages whose turns never finished (the gateway stopped mid-turn).
    pub fn pending_turns(&self) -> Result<Vec<PendingTurn>> {
        self.turns
            .iter()
            .values()
            .map(|v| from_json(&v?, "pending turn"))
            .collect()
    }

    /// Bytes sled occupies on disk: tracked to watch SD-card wear and space amplification.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
        || e.raw_os_error() == Some(libc::EWOULDBLOCK)
        || e.to_string().contains("lock")
}

fn u64_from(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[8 - n..].copy_from_slice(&v[v.len() - n..]);
    u64::from_be_bytes(b)
}

fn to_json<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("store records always serialise")
}

fn from_json<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Role;

    pub(crate) fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        (dir, store)
    }

    pub(crate) fn msg(id: &str, text: &str) -> HistoryMessage {
        HistoryMessage {
            message_id: id.into(),
            role: Role::User,
            text: text.into(),
            reasoning: None,
            model: None,
            tokens: None,
            runtime: None,
            ts: 1,
            media: vec![],
        }
    }

    #[test]
    fn cursors_increase_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
            let c = s
                .commit(&vec![Change::Outbox(Bytes::from_static(b"{\"v\":1,}")); 3])
                .unwrap();
            assert_eq!(c, vec![1, 2, 3]);
            s.sync_blocking().unwrap();
        }
        let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        assert_eq!(s.cursor_head().unwrap(), 3);
        let c = s
            .commit(&[Change::Outbox(Bytes::from_static(b"{\"v\":1,}"))])
            .unwrap();
        assert_eq!(c, vec![4]);
    }

    #[test]
    fn a_second_open_reports_the_lock() {
        let (dir, _s) = temp_store();
        match Store::open(dir.path(), 1 << 20, Duration::from_millis(100)) {
            Err(StoreError::Locked { .. }) => {}
            other => panic!("expected Locked, got {:?}", other.err()),
        }
    }

    #[test]
    fn replacing_a_message_keeps_its_place() {
        let (_d, s) = temp_store();
        let lane = Lane::new("default", None);
        s.commit(&[Change::PutMessage(lane.clone(), msg("a", "1"))])
            .unwrap();
        s.commit(&[Change::PutMessage(lane.clone(), msg("b", "2"))])
            .unwrap();
        s.commit(&[Change::PutMessage(lane.clone(), msg("a", "1 edited"))])
            .unwrap();
        let page = s.history_page(&lane, None, 10).unwrap().unwrap();
        let ids: Vec<_> = page
            .messages
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(page.messages[0].text, "1 edited");
    }
}
