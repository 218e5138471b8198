//! The `read.receipt` extension: an app says a lane is read up to a message, and the household
//! shares it. The marker only moves forward; each move is committed with a `read.marker` outbox
//! frame, so every device that asked learns it live or by `sync`, and `hello.ack.read` gives
//! the markers at connect. The hub keeps the markers in memory (`State::read_marks`), loaded
//! from the store at start, so a receipt that moves nothing costs no write.

use crate::protocol::{Frame, LaneRead};
use crate::store::{Change, ReadMark};

use super::errors::Refusal;
use super::state::Hub;

impl Hub {
    /// `read.receipt {message_id}` in a lane. No answer when it is taken (v1 defines none for
    /// this frame; the `read.marker` it causes goes to the sender too when it asked for the
    /// extension); an `error{not_found}` for a lane, message or message-in-lane that does
    /// not exist.
    pub(super) async fn read_receipt(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
        message_id: String,
    ) -> Result<(), Refusal> {
        let (lane, _) = self.resolve_lane(chat_id, thread_id)?;
        let shown: String = message_id.chars().take(64).collect();
        let Some((found_in, message)) = self
            .store
            .query_message(message_id.clone())
            .await
            .map_err(|e| self.queries.failed(self, e))?
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
        if !self.read_marks.advance(&lane, &mark) {
            return Ok(());
        }
        let frame = Frame::read_marker(&mark.message_id)
            .in_lane(&lane.chat_id, lane.thread())
            .outboxed();
        self.commit(
            vec![Change::MarkRead(lane, mark), Change::Outbox(frame)],
            None,
        )
        .await?;
        Ok(())
    }

    /// Every existing lane's read marker, sorted, for `hello.ack.read`: one per lane, so at
    /// most as many as the directory has lanes. Markers of lanes deleted meanwhile are
    /// dropped here (the store drops its copies with the channel).
    pub(super) fn read_lanes(&self) -> Vec<LaneRead> {
        let marks = self.read_marks.all();
        let mut out = Vec::with_capacity(marks.len());
        for (lane, mark) in marks {
            if self.directory.lane_exists(&lane) {
                out.push(LaneRead {
                    chat_id: lane.chat_id,
                    thread_id: lane.thread_id,
                    message_id: mark.message_id,
                });
            } else {
                self.read_marks.forget(&lane);
            }
        }
        out.sort();
        out
    }
}
