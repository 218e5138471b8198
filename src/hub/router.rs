//! The router: one decoded request from an authenticated connection goes to the part of the hub
//! that answers it, and a refusal comes back as an `error` frame. Also how a frame's
//! `chat_id`/`thread_id` name a lane.

use std::rc::Rc;

use crate::ids;
use crate::outlet::Outlet;
use crate::protocol::{Channel, Frame, Lane, Request, RequestFrame};

use super::agent_calls::CallKind;
use super::approvals;
use super::errors::Refusal;
use super::state::Hub;

impl Hub {
    /// Routes one decoded request from an authenticated connection.
    pub async fn handle(self: &Rc<Self>, outlet: &Rc<Outlet>, frame: RequestFrame) {
        let id = frame.id;
        let result: Result<(), Refusal> = match frame.request {
            Request::Hello(_) => Err(Refusal::unsupported("this connection already said hello")),
            Request::Ping { ts } => {
                outlet.push_frame(&Frame::pong(id, ts.unwrap_or_else(ids::now_ms)));
                Ok(())
            }
            Request::Sync { cursor } => {
                outlet.push_replay(cursor.max(0) as u64, id);
                Ok(())
            }
            Request::History(h) => {
                self.queries
                    .history(&**self, outlet, &frame.chat_id, &frame.thread_id, id, h)
                    .await
            }
            Request::MessageSend(m) => {
                self.messages
                    .send(self, outlet, frame.chat_id, frame.thread_id, id, m)
                    .await
            }
            Request::ChannelList => {
                self.store
                    .channels()
                    .map_err(Refusal::internal)
                    .map(|channels| {
                        let channels = self.directory.for_wire(channels);
                        outlet.push_frame(&Frame::channel_list(id, &channels));
                    })
            }
            Request::Search(req) => {
                self.queries
                    .search(&**self, outlet, id, (frame.chat_id, frame.thread_id), req)
                    .await
            }
            Request::MessageDelete { message_ids } => {
                self.queries
                    .delete_messages(&**self, outlet, id, message_ids)
                    .await
            }
            Request::MediaPull { media_id } => match self.store.media(&media_id) {
                Ok(Some(record)) => {
                    outlet.push_pull(self.media.files().blob_path(&record.sha256), id);
                    Ok(())
                }
                Ok(None) => Err(Refusal::not_found(format!(
                    "no media `{}`",
                    media_id.chars().take(64).collect::<String>()
                ))),
                Err(e) => Err(Refusal::internal(e)),
            },
            // Not unreachable: the session keeps uploads from the hub (`session::reader`), but
            // `handle` is public and its type still admits them, so a caller that skipped the
            // session is told no rather than left with half an upload.
            Request::MediaUploadStart(_) | Request::MediaUploadEnd { .. } => Err(
                Refusal::unsupported("uploads are taken by the device's session, not the hub"),
            ),
            Request::FcmRegister {
                fcm_token,
                ntfy_topic,
            } => {
                self.push
                    .register_target(&outlet.device_id, fcm_token, ntfy_topic)
                    .await
            }
            Request::CommandsCatalog => {
                outlet.push_frame(&Frame::commands_catalog(id, self.commands.catalog()));
                Ok(())
            }
            // An approval's answer goes to the agent, and a model picker's answer asks the
            // agent for its models: both run beside the reader.
            Request::PickerSelect { picker_id, value }
                if picker_id.starts_with(approvals::PICKER_PREFIX) =>
            {
                self.agent_calls
                    .slot(&outlet.device_id, CallKind::Approval)
                    .map(|slot| {
                        let (hub, device) = (self.clone(), outlet.device_id.clone());
                        slot.beside(outlet, id, async move {
                            let approvals = &hub.open_approvals;
                            approvals.answer(&*hub, &device, &picker_id, &value).await
                        })
                    })
            }
            Request::PickerSelect { picker_id, value }
                if self.commands.agent_call_of(&picker_id).is_some() =>
            {
                let kind = self
                    .commands
                    .agent_call_of(&picker_id)
                    .unwrap_or(CallKind::Jobs);
                self.agent_calls.slot(&outlet.device_id, kind).map(|slot| {
                    let hub = self.clone();
                    slot.beside(outlet, id, async move {
                        hub.commands.select(&*hub, &picker_id, &value).await
                    })
                })
            }
            Request::PickerSelect { picker_id, value } => {
                self.commands.select(&**self, &picker_id, &value).await
            }
            Request::AgentStop => self
                .resolve_lane(frame.chat_id.as_deref(), frame.thread_id.as_deref())
                .and_then(|(lane, _)| {
                    // The same as `/stop` in that lane, without a command message to answer.
                    if self.turns.stop(&lane) {
                        Ok(())
                    } else {
                        Err(Refusal::not_found(format!("nothing is running in {lane}")))
                    }
                }),
            Request::AgentSteer { text } => {
                self.messages
                    .steer(
                        self,
                        outlet,
                        (frame.chat_id.as_deref(), frame.thread_id.as_deref()),
                        id,
                        text,
                        false,
                    )
                    .await
            }
            Request::ReadReceipt { message_id } => {
                self.read_marks
                    .receipt(
                        &**self,
                        frame.chat_id.as_deref(),
                        frame.thread_id.as_deref(),
                        message_id,
                    )
                    .await
            }
            other => {
                let target = frame.thread_id.or(frame.chat_id);
                self.directory
                    .handle_request(&**self, outlet.conn_id, id, target, other)
                    .await
            }
        };
        if let Err(refusal) = result {
            outlet.push_frame(&Frame::error(id, refusal.code, refusal.message));
        }
    }

    /// Resolves a frame's `chat_id`/`thread_id` to a lane and its root channel (the addressing
    /// rule is the directory's: `Directory::resolve_lane`).
    pub fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        self.directory.resolve_lane(chat_id, thread_id)
    }
}
