//! The household's read markers per lane: their one owner (also in the store, through the
//! committer), which answers receipts and greets devices with them.
//!
//! The `read.receipt` extension: an app says a lane is read up to a message, and the household
//! shares it. The marker only moves forward; each move is committed with a `read.marker` outbox
//! frame, so every device that asked learns it live or by `sync`, and `hello.ack.read` gives
//! the markers at connect. [`ReadMarks`] keeps them in memory, loaded from the store at start,
//! so a receipt that moves nothing costs no write; it reaches the hub through the port.

use crate::protocol::{Frame, Lane, LaneRead};
use crate::store::{Change, ReadMark, Store, StoreError};

use super::errors::Refusal;
use super::port::Port;

/// What read marks ask of the hub beyond the core: a failed history query as a device's refusal.
pub(super) trait ReadMarksPort: Port {
    /// A history query's failure as the refusal a device gets (damage is noted as a cause).
    fn query_failed(&self, e: StoreError) -> Refusal;
}

/// Per lane, where the household has read it up to (also in the store). Its one owner: a marker
/// only moves forward.
pub(super) struct ReadMarks {
    marks: std::cell::RefCell<std::collections::HashMap<Lane, ReadMark>>,
    /// Where a receipt's message is looked up.
    store: Store,
}

impl ReadMarks {
    pub(super) fn new(store: Store, marks: Vec<(Lane, ReadMark)>) -> ReadMarks {
        ReadMarks {
            marks: std::cell::RefCell::new(marks.into_iter().collect()),
            store,
        }
    }

    /// Moves the lane's marker to `mark`; `false` (nothing changes) when it is not past it.
    pub(super) fn advance(&self, lane: &Lane, mark: &ReadMark) -> bool {
        let mut marks = self.marks.borrow_mut();
        if marks.get(lane).is_some_and(|m| !mark.is_past(m)) {
            return false;
        }
        marks.insert(lane.clone(), mark.clone());
        true
    }

    pub(super) fn all(&self) -> Vec<(Lane, ReadMark)> {
        self.marks
            .borrow()
            .iter()
            .map(|(l, m)| (l.clone(), m.clone()))
            .collect()
    }

    pub(super) fn forget(&self, lane: &Lane) {
        self.marks.borrow_mut().remove(lane);
    }
}

impl ReadMarks {
    /// `read.receipt {message_id}` in a lane. No answer when it is taken (v1 defines none for
    /// this frame; the `read.marker` it causes goes to the sender too when it asked for the
    /// extension); an `error{not_found}` for a lane, message or message-in-lane that does
    /// not exist.
    pub(super) async fn receipt(
        &self,
        port: &impl ReadMarksPort,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
        message_id: String,
    ) -> Result<(), Refusal> {
        let (lane, _) = port.resolve_lane(chat_id, thread_id)?;
        let shown: String = message_id.chars().take(64).collect();
        let Some((found_in, message)) = self
            .store
            .query_message(message_id.clone())
            .await
            .map_err(|e| port.query_failed(e))?
        else {
            return Err(Refusal::not_found(format!("no message `{shown}`")));
        };
        if found_in != lane {
            return Err(Refusal::not_found(format!(
                "message `{shown}` is in {found_in}, not in {lane}"
            )));
        }
        let mark = ReadMark {
            message_id,
            ts: message.ts,
        };
        // Coalescing: a receipt at or behind the marker (an app scrolling back, a burst of
        // receipts for one screen, another device that read further) changes nothing. Set
        // before the commit: a receipt arriving while this one is committed compares with it,
        // so commits never move the marker back whatever order they finish in.
        if !self.advance(&lane, &mark) {
            return Ok(());
        }
        let frame = Frame::read_marker(&mark.message_id)
            .in_lane(&lane.chat_id, lane.thread())
            .outboxed();
        port.commit(
            vec![Change::MarkRead(lane, mark), Change::Outbox(frame)],
            None,
        )
        .await?;
        Ok(())
    }

    /// Every existing lane's read marker, sorted, for `hello.ack.read`: one per lane, so at
    /// most as many as the directory has lanes. Markers of lanes deleted meanwhile are
    /// dropped here (the store drops its copies with the channel).
    pub(super) fn lanes(&self, port: &impl ReadMarksPort) -> Vec<LaneRead> {
        let marks = self.all();
        let mut out = Vec::with_capacity(marks.len());
        for (lane, mark) in marks {
            if port.lane_exists(&lane) {
                out.push(LaneRead {
                    chat_id: lane.chat_id,
                    thread_id: lane.thread_id,
                    message_id: mark.message_id,
                });
            } else {
                self.forget(&lane);
            }
        }
        out.sort();
        out
    }
}
