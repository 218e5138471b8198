//! `message.send`: the user's message (with a record that its turn is pending) is stored before
//! anything is announced; then the sender gets `read.receipt`, every device gets the echo, and
//! the message is queued for its lane's turn (or, for a gateway command, answered at once).

use std::rc::Rc;

use crate::agent::Agent;
use crate::config::Limits;
use crate::ids;
use crate::outlet::Outlet;
use crate::protocol::fit::{self, OutBudget};
use crate::protocol::{Channel, Frame, HistoryMessage, Lane, MediaRef, MessageSend, Role};
use crate::store::{Change, PendingTurn, Store};

use super::agent_calls::{CallKind, CallSlot};
use super::commands::Command;
use super::directory;
use super::errors::CommitError;
use super::errors::Refusal;
use super::port::Port;
use super::turns::QueuedTurn;
use super::Origin;

/// Longest auto-thread title derived from the first message.
const AUTO_TITLE_CHARS: usize = 48;

/// What the user's messages ask of the hub beyond the core: room in the directory and the
/// lane, the device's agent-call slot, the commit that answers the sender, and where a message
/// goes next (the commands, the lane's turns, the running answer).
#[allow(async_fn_in_trait)]
pub(super) trait MessagesPort: Port {
    /// The directory has room for the new thread `thread`.
    fn thread_fits(&self, thread: &Channel) -> bool;

    /// Turns waiting in `lane` behind the running one.
    fn lane_waiting(&self, lane: &Lane) -> usize;

    /// The device's slot for a call of `kind` to the agent, or the refusal while its previous
    /// one is under way.
    fn agent_call(&self, device_id: &str, kind: CallKind) -> Result<CallSlot, Refusal>;

    /// Makes `changes` durable and publishes them, answering the requester as `origin` says.
    async fn commit_answering(
        &self,
        changes: Vec<Change>,
        origin: Origin,
    ) -> Result<(), CommitError>;

    /// Runs a gateway command sent in `lane` and posts its answer there.
    async fn run_command(&self, lane: &Lane, command: Command);

    /// Queues a user's message as a turn in `lane`.
    fn enqueue_turn(&self, lane: Lane, turn: QueuedTurn);

    /// Hands a stored steering message to the running answer of `lane` (or queues it).
    async fn hand_steer(&self, lane: Lane, message_id: String, text: String);
}

/// The user's messages on their way in: `message.send` and `agent.steer` checked, stored,
/// echoed, and handed to their lane's turns (or, for a gateway command, to the commands). It
/// owns what a message is checked against (the limits, the device's uploads in the store) and
/// reaches the rest of the hub through the port.
pub(super) struct Messages {
    store: Store,
    agent: Rc<dyn Agent>,
    limits: Limits,
}

impl Messages {
    pub(super) fn new(store: Store, agent: Rc<dyn Agent>, limits: Limits) -> Messages {
        Messages {
            store,
            agent,
            limits,
        }
    }

    /// `message.send`: checks the message, stores it (in a new auto-thread if asked), echoes it
    /// to every device with a `read.receipt` to the sender first, then queues its turn or, for
    /// a gateway command, answers it.
    pub(super) async fn send<P: MessagesPort + 'static>(
        &self,
        hub: &Rc<P>,
        outlet: &Rc<Outlet>,
        chat_id: Option<String>,
        thread_id: Option<String>,
        id: Option<i64>,
        req: MessageSend,
    ) -> Result<(), Refusal> {
        self.check_text_size(&req.text)?;
        let media = self.attachments(&outlet.device_id, &req.media_refs)?;
        if req.text.trim().is_empty() && media.is_empty() {
            return Err(Refusal::unsupported("an empty message has nothing to send"));
        }
        let (mut lane, root) = hub.resolve_lane(chat_id.as_deref(), thread_id.as_deref())?;
        if root.automation {
            return Err(Refusal::unsupported(format!(
                "`{}` is an automation channel: it only receives gateway output",
                root.name
            )));
        }
        let command = super::commands::parse(&req.text);
        if let Some(super::commands::Command::Steer(Some(text))) = &command {
            if media.is_empty() {
                let (chat, thread) = (lane.chat_id.clone(), lane.thread_id.clone());
                return self
                    .steer(
                        hub,
                        outlet,
                        (Some(&chat), thread.as_deref()),
                        id,
                        text.clone(),
                        true,
                    )
                    .await;
            }
        }
        let mut changes = Vec::new();
        if let Some(thread) = auto_thread(&**hub, &lane, &root, &req) {
            lane = Lane::new(&lane.chat_id, Some(&thread.chat_id));
            changes.push(Change::PutChannel(thread.clone()));
            changes.push(Change::Outbox(
                Frame::channel_entry("channel.created", &thread).outboxed(),
            ));
        }
        if command.is_none() {
            self.check_lane_room(&**hub, &lane)?;
        }
        // `/model` and `/jobs` ask the agent: answered beside the reader, one per device and
        // kind at a time, refused before the command is stored.
        let asks_agent = match command {
            Some(super::commands::Command::Model(_)) => Some(CallKind::Models),
            Some(super::commands::Command::Jobs) => Some(CallKind::Jobs),
            _ => None,
        };
        let slot = match asks_agent {
            Some(kind) => Some(hub.agent_call(&outlet.device_id, kind)?),
            None => None,
        };
        let message = HistoryMessage {
            media,
            ..HistoryMessage::text_only(ids::message_id(), Role::User, req.text, ids::now_ms())
        };
        let reply_to = req
            .reply_to
            .as_deref()
            .filter(|r| crate::protocol::is_valid_id(r));
        let echo = Frame::message(&message)
            .with_reply_to(reply_to)
            .in_lane(&lane.chat_id, lane.thread());
        changes.push(Change::PutMessage(lane.clone(), message.clone()));
        changes.push(Change::OutboxOf {
            message_id: message.message_id.clone(),
            frame: echo.outboxed(),
        });
        if command.is_none() {
            changes.push(Change::BeginTurn(PendingTurn {
                user_message_id: message.message_id.clone(),
                lane: lane.clone(),
                text: message.text.clone(),
            }));
        }
        let receipt =
            Frame::read_receipt(id, &message.message_id).in_lane(&lane.chat_id, lane.thread());
        hub.commit_answering(
            changes,
            Origin {
                conn: outlet.conn_id,
                before: Some(receipt),
                reply: None,
            },
        )
        .await?;
        if let Some(command) = command {
            // Answered by the gateway itself, never sent to the agent.
            match slot {
                Some(slot) => {
                    let hub = hub.clone();
                    slot.beside(outlet, id, async move {
                        hub.run_command(&lane, command).await;
                        Ok(())
                    });
                }
                None => hub.run_command(&lane, command).await,
            }
            return Ok(());
        }
        hub.enqueue_turn(
            lane,
            QueuedTurn {
                user_message_id: message.message_id,
                text: message.text,
                media: message.media,
                automation: None,
                resume_run: None,
            },
        );
        Ok(())
    }

    /// Stores `text` as a steering message in the lane `(chat_id, thread_id)` names, shows it to
    /// every device, and hands it to the running answer (or makes it the next message).
    /// `receipt`: the sender
    /// sent it as a `message.send` (`/steer TEXT`) and is owed a `read.receipt` for it.
    pub(super) async fn steer<P: MessagesPort + 'static>(
        &self,
        hub: &Rc<P>,
        outlet: &Rc<Outlet>,
        (chat_id, thread_id): (Option<&str>, Option<&str>),
        id: Option<i64>,
        text: String,
        receipt: bool,
    ) -> Result<(), Refusal> {
        self.check_text_size(&text)?;
        let text = text.trim().to_owned();
        if text.is_empty() {
            return Err(Refusal::unsupported(
                "agent.steer needs text: what the running answer should do differently",
            ));
        }
        let (lane, root) = hub.resolve_lane(chat_id, thread_id)?;
        if root.automation {
            return Err(Refusal::unsupported(format!(
                "`{}` is an automation channel: it only receives gateway output",
                root.name
            )));
        }
        // It may become the next message: refused now, before anything is stored, where the
        // lane could not queue it.
        self.check_lane_room(&**hub, &lane)?;
        // An agent that takes steers is asked beside the reader (one steer per device at a
        // time): the phone's other frames are answered while the agent takes its time. Refused
        // before anything is stored.
        let slot = if self.agent.can_steer() {
            Some(hub.agent_call(&outlet.device_id, CallKind::Steer)?)
        } else {
            None
        };
        let message = HistoryMessage {
            steer: true,
            ..HistoryMessage::text_only(ids::message_id(), Role::User, text, ids::now_ms())
        };
        let echo = Frame::message(&message).in_lane(&lane.chat_id, lane.thread());
        let changes = vec![
            Change::PutMessage(lane.clone(), message.clone()),
            Change::OutboxOf {
                message_id: message.message_id.clone(),
                frame: echo.outboxed(),
            },
            Change::BeginTurn(PendingTurn {
                user_message_id: message.message_id.clone(),
                lane: lane.clone(),
                text: message.text.clone(),
            }),
        ];
        let before = receipt.then(|| {
            Frame::read_receipt(id, &message.message_id).in_lane(&lane.chat_id, lane.thread())
        });
        hub.commit_answering(
            changes,
            Origin {
                conn: outlet.conn_id,
                before,
                reply: None,
            },
        )
        .await?;
        match slot {
            Some(slot) => {
                let hub = hub.clone();
                slot.beside(outlet, id, async move {
                    hub.hand_steer(lane, message.message_id, message.text).await;
                    Ok(())
                });
            }
            None => hub.hand_steer(lane, message.message_id, message.text).await,
        }
        Ok(())
    }

    /// A message's text must fit both the request limit and, once JSON-escaped, its share of
    /// an outgoing frame: raw bytes understate the wire, since the echo, history and sync all
    /// carry the text escaped.
    fn check_text_size(&self, text: &str) -> Result<(), Refusal> {
        let limits = &self.limits;
        if text.len() > limits.max_text_bytes {
            return Err(Refusal::unsupported(format!(
                "message text is {} bytes; the limit is {} (limits.max_text_bytes)",
                text.len(),
                limits.max_text_bytes
            )));
        }
        let escaped = fit::escaped_len(text);
        let text_budget = OutBudget::new(limits.max_out_frame_bytes).text;
        if escaped > text_budget {
            return Err(Refusal::unsupported(format!(
                "message text is {escaped} bytes once JSON-escaped (a control character takes six); \
                 frames the gateway sends must fit limits.max_out_frame_bytes, which leaves {text_budget} for a message's text"
            )));
        }
        Ok(())
    }

    /// A lane whose agent is busy takes `limits.lane_queue_depth` more messages, then refuses.
    fn check_lane_room(&self, hub: &impl MessagesPort, lane: &Lane) -> Result<(), Refusal> {
        let waiting = hub.lane_waiting(lane);
        if waiting > 0 && waiting >= self.limits.lane_queue_depth {
            return Err(Refusal::rate_limited(format!(
                "{waiting} messages are already waiting for the agent in this conversation (limits.lane_queue_depth); wait for a reply"
            )));
        }
        Ok(())
    }

    /// Resolves a device's upload refs to the stored files they name.
    fn attachments(&self, device_id: &str, refs: &[String]) -> Result<Vec<MediaRef>, Refusal> {
        let max = self.limits.max_media_per_message;
        if refs.len() > max {
            return Err(Refusal::unsupported(format!(
                "at most {max} attachments per message (limits.max_media_per_message)"
            )));
        }
        let mut out = Vec::new();
        for r in refs {
            let record = self
                .store
                .media_by_ref(device_id, r)
                .map_err(Refusal::internal)?
                .ok_or_else(|| {
                    Refusal::not_found(format!(
                        "media_ref `{}` is not an upload of this device (upload it first)",
                        r.chars().take(64).collect::<String>()
                    ))
                })?;
            out.push(record.to_ref(None));
        }
        Ok(out)
    }
}

/// The thread a message to the default channel asked to start (`auto_thread`), titled from
/// its first line. A directory with no room left for another entry (its icons fill the
/// hello.ack budget) keeps the message in the default lane rather than refusing it.
fn auto_thread(
    hub: &impl MessagesPort,
    lane: &Lane,
    root: &Channel,
    req: &MessageSend,
) -> Option<Channel> {
    let wants_thread = req.auto_thread
        && root.is_default
        && lane.thread_id.is_none()
        && !req.text.trim_start().starts_with('/');
    wants_thread
        .then(|| directory::new_thread(&lane.chat_id, auto_title(&req.text), true))
        .filter(|t| hub.thread_fits(t))
}

/// A thread title from the first line of a message, cut at a word boundary.
fn auto_title(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.chars().count() <= AUTO_TITLE_CHARS {
        return line.to_owned();
    }
    let cut: String = line.chars().take(AUTO_TITLE_CHARS).collect();
    let cut = match cut.rfind(' ') {
        Some(i) if i > AUTO_TITLE_CHARS / 2 => &cut[..i],
        _ => cut.as_str(),
    };
    format!("{}\u{2026}", cut.trim_end())
}

#[cfg(test)]
mod tests {
    use super::auto_title;

    #[test]
    fn auto_titles_are_short_first_lines() {
        assert_eq!(auto_title("  Plan the garden\nmore"), "Plan the garden");
        let long = "word ".repeat(30);
        let t = auto_title(&long);
        assert!(t.chars().count() <= 49 && t.ends_with('\u{2026}'), "{t}");
    }
}
