//! `Directory`: the channel directory as the hub serves it. It owns the lookups (a frame's
//! `chat_id`/`thread_id` to a lane, an entry by id, the default channel) and the directory's
//! limits (how big it may grow, how it travels in one frame); `directory/channels.rs` adds the `channel.*`
//! requests, which reach back to the hub through the port (`port.rs`) to commit and to end the
//! lanes of a deleted channel. It imports nothing of the hub but the port and the errors.

use crate::config::Limits;
use crate::protocol::fit::OutBudget;
use crate::protocol::{Channel, Lane};
use crate::store::{Store, DEFAULT_CHAT_ID};

use super::errors::Refusal;

mod channels;

pub(super) use channels::new_thread;
pub(super) use channels::DirectoryPort;

/// The channel directory and its limits.
pub(super) struct Directory {
    store: Store,
    limits: Limits,
}

impl Directory {
    pub(super) fn new(store: Store, limits: Limits) -> Directory {
        Directory { store, limits }
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    pub(super) fn lane_exists(&self, lane: &Lane) -> bool {
        let exists = |id: &str| matches!(self.store.channel(id), Ok(Some(_)));
        exists(&lane.chat_id) && lane.thread().is_none_or(exists)
    }

    /// Resolves a frame's `chat_id`/`thread_id` to a lane and its root channel.
    ///
    /// The addressing rule: a thread's frames carry `chat_id` = its parent channel and
    /// `thread_id` = the thread's own id. For convenience a thread's own id alone in `chat_id`
    /// is accepted too and means the same lane. No `chat_id` means the default channel.
    pub(super) fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        let default_id;
        let chat_id = match chat_id {
            Some(c) => c,
            None => {
                default_id = self.default_channel_id();
                default_id.as_str()
            }
        };
        let entry = self.channel(chat_id)?;
        if entry.is_thread() {
            if thread_id.is_some() {
                return Err(Refusal::not_found(format!(
                    "`{chat_id}` is a thread; use its parent as chat_id"
                )));
            }
            let parent = entry.parent_chat_id.clone().unwrap_or_default();
            let root = self.channel(&parent)?;
            return Ok((Lane::new(&parent, Some(chat_id)), root));
        }
        if let Some(t) = thread_id {
            let thread = self.channel(t)?;
            if !thread.is_thread() || thread.parent_chat_id.as_deref() != Some(chat_id) {
                return Err(Refusal::not_found(format!(
                    "no thread `{t}` in channel `{chat_id}`"
                )));
            }
        }
        Ok((Lane::new(chat_id, thread_id), entry))
    }

    /// A directory entry, or the `not_found` refusal naming it.
    pub(super) fn channel(&self, chat_id: &str) -> Result<Channel, Refusal> {
        self.store
            .channel(chat_id)
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::not_found(format!("no channel `{chat_id}`")))
    }

    /// The default channel, which always exists (the store's own id before any directory change).
    fn default_channel_id(&self) -> String {
        self.store
            .channels()
            .ok()
            .and_then(|all| all.into_iter().find(|c| c.is_default))
            .map(|c| c.chat_id)
            .unwrap_or_else(|| DEFAULT_CHAT_ID.to_owned())
    }

    /// What each kind of outgoing content may take (`limits.max_out_frame_bytes`).
    fn out_budget(&self) -> OutBudget {
        OutBudget::new(self.limits.max_out_frame_bytes)
    }

    /// The whole directory travels in one frame (`hello.ack`, `channel.list`), so a change that
    /// would grow it past `limits.max_out_frame_bytes` (less the reserve for the rest of the frame)
    /// is refused: otherwise no device could ever say hello again, and no client could undo it.
    /// Icons are what can fill it (names are at most `max_name_chars`), so the message says how
    /// much they take. A change that does not grow an over-full directory (one from before this
    /// limit) is always allowed, so it can be brought back under.
    pub(super) fn room(&self, changed: &[Channel]) -> Result<(), Refusal> {
        let mut all = self.store.channels().map_err(Refusal::internal)?;
        let before = directory_bytes(&all);
        for c in changed {
            match all.iter_mut().find(|e| e.chat_id == c.chat_id) {
                Some(e) => *e = c.clone(),
                None => all.push(c.clone()),
            }
        }
        let after = directory_bytes(&all);
        let budget = self.out_budget().content;
        if after <= budget || after <= before {
            return Ok(());
        }
        let icons: usize = all
            .iter()
            .filter_map(|c| c.icon.as_ref())
            .map(String::len)
            .sum();
        Err(Refusal::unsupported(format!(
            "the channel directory would take {after} bytes; it is sent whole in hello.ack and must fit {budget} \
             (limits.max_out_frame_bytes less {reserve} for the rest of the frame); icons take {icons} of it: \
             use a smaller icon or clear another channel's icon",
            reserve = crate::protocol::fit::OUT_RESERVE,
        )))
    }

    /// The directory as it is sent. One stored before the directory limit existed may be over it:
    /// the largest icons are left out of the frame (the app shows its letter avatar instead) until
    /// it fits, so a hello always works and the owner can clear an icon.
    pub(super) fn for_wire(&self, mut channels: Vec<Channel>) -> Vec<Channel> {
        let budget = self.out_budget().content;
        let mut size = directory_bytes(&channels);
        if size <= budget {
            return channels;
        }
        let mut by_icon: Vec<(usize, usize)> = channels
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.icon.as_ref().map(|icon| (icon.len(), i)))
            .collect();
        by_icon.sort_unstable_by(|a, b| b.cmp(a));
        let mut left_out = 0;
        for (len, i) in by_icon {
            if size <= budget {
                break;
            }
            channels[i].icon = None;
            size = size.saturating_sub(len);
            left_out += 1;
        }
        tracing::warn!(
        left_out,
        bytes = size,
        budget,
        "the channel directory is over limits.max_out_frame_bytes: the largest icons are left out of hello.ack and channel.list; clear or shrink them"
    );
        channels
    }
}

/// Encoded size of the directory as `hello.ack` and `channel.list` carry it.
fn directory_bytes(channels: &[Channel]) -> usize {
    serde_json::to_vec(channels).map_or(usize::MAX, |b| b.len())
}
