//! The store: everything on disk, in sled (the outbox, the journal, the small records) and SQLite
//! (history, its search index and media uses). No other module touches either.
//!
//! The store speaks in intents (append these frames to the outbox, keep this message, page this
//! lane) and owns the layout, documented in docs/storage.md. Writes that belong together are one
//! commit, made atomic by its commit record (`engine/commit.rs`), so a power cut leaves either all
//! of a change or none of it; `sync` (`engine/durability.rs`) makes everything written so far
//! durable and is what the hub awaits before it tells any device about a change.
//!
//! This file only declares the rooms and says what the rest of the crate may name. The rooms:
//! the subjects (devices, history, media, …) over plain record types; `engine/`, sled's handle
//! and everything that opens, checks, recovers, commits and rebuilds; the history database
//! (`sql*.rs`); and `base.rs`, the errors and encodings under all of them. A room imports only
//! rooms after its own in `STORE_ROOMS` (tests/layering.rs), never this file, so the order a
//! start walks the engine reads top to bottom (docs/architecture.md, "The store").

// The store's API by subject.
mod agent_jobs;
mod approvals;
pub mod backup;
mod change;
mod devices;
mod directory;
mod history;
mod lane_models;
mod media;
mod outbox;
mod read_marks;
mod records;
pub mod search;
mod sessions;
mod todos;
mod turns;
mod view;
// sled's handle and everything that opens, checks, recovers, commits and rebuilds.
mod engine;
// The history database and the journal that feeds it.
mod journal;
mod sql;
mod sql_query;
mod sql_write;
// Under every room: lane keys, search's folding, errors and encodings.
mod base;
mod fold;
mod keys;

/// Kept here for the callers that named it in the store before it moved to a leaf.
pub use crate::units::human_bytes;
pub use agent_jobs::AgentJob;
pub use approvals::{ApprovalRecord, RunRecord};
pub use base::{Result, StoreError};
pub use change::Change;
pub use devices::{Device, DeviceOrigin};
pub use directory::DEFAULT_CHAT_ID;
pub use engine::check::EXIT_DAMAGED;
pub use engine::durability::STORE_RESERVE_BYTES;
pub use engine::handle::Store;
pub use engine::kill_points::{kill_point, KillPoint, START_KILL_POINTS};
pub use engine::open::exists_in;
pub use engine::safety_copy::SAFETY_DIR;
pub use engine::witness::WITNESS_FILE;
pub use history::purge_changes;
pub use lane_models::{LaneModel, VoiceMode};
pub use media::MediaRecord;
pub use read_marks::ReadMark;
pub use records::Record;
pub use sessions::AgentSession;
/// The history database's directory in the data dir.
pub use sql::HISTORY_DIR;
pub use turns::PendingTurn;
pub use view::StoreView;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{HistoryMessage, Lane, Role};
    use bytes::Bytes;
    use std::time::Duration;

    pub(crate) fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        (dir, store)
    }

    pub(crate) fn msg(id: &str, text: &str) -> HistoryMessage {
        HistoryMessage::text_only(id.into(), Role::User, text.into(), 1)
    }

    #[test]
    fn cursors_increase_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
            let c = s
                .commit(&vec![
                    Change::Outbox(
                        Bytes::from_static(b"{\"v\":1,}").into()
                    );
                    3
                ])
                .unwrap();
            assert_eq!(c, vec![1, 2, 3]);
            s.sync_blocking().unwrap();
        }
        let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        assert_eq!(s.cursor_head().unwrap(), 3);
        let c = s
            .commit(&[Change::Outbox(Bytes::from_static(b"{\"v\":1,}").into())])
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
        // Not in history until durable in sled (read-your-writes holds after `sync`).
        assert!(s
            .history_page(&lane, None, 10)
            .unwrap()
            .unwrap()
            .messages
            .is_empty());
        s.sync_blocking().unwrap();
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
