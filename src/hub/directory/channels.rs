//! Channel directory requests: create, rename, default, favorite, icon, automation, delete.
//!
//! Each change is committed with its broadcast frame (`channel.created`, `channel.renamed`,
//! `channel.deleted`), so every device sees it, and a device that was away replays it on `sync`.
//! The requester gets the same frame carrying its request id.

use base64::Engine;

use super::Directory;
use crate::hub::errors::Refusal;
use crate::hub::port::{Port, Reply};
use crate::ids;
use crate::outlet::ConnId;
use crate::protocol::{
    is_valid_id, Channel, ChannelCreate, ChannelIcon, ChannelKind, CreateKind, Frame, Lane, Request,
};
use crate::store::{purge_changes, Change};

/// What the directory asks of the hub beyond the core: dropping what lives on about the
/// lanes a channel deletion removes.
pub(in crate::hub) trait DirectoryPort: Port {
    /// Drops everything live about deleted lanes (their turns, queues and settings); returns
    /// the changes to commit with the deletion.
    fn forget_lanes(&self, gone: &dyn Fn(&Lane) -> bool) -> Vec<Change>;
}

impl Directory {
    /// The directory requests (`channel.*`): create, rename, icon, automation mark, default, delete.
    pub(in crate::hub) async fn handle_request(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        id: Option<i64>,
        target: Option<String>,
        request: Request,
    ) -> Result<(), Refusal> {
        if let Request::ChannelCreate(c) = request {
            return self.create_channel(port, conn, id, target, c).await;
        }
        let target = target.ok_or_else(|| {
            Refusal::not_found("this request needs the channel's chat_id in the envelope")
        })?;
        let mut entry = self.channel(&target)?;
        match request {
            Request::ChannelRename { name } => {
                entry.name = self.valid_channel_name(&name)?;
                self.save_channel(port, conn, id, vec![entry]).await
            }
            Request::ChannelFavorite { on } => {
                entry.favorite = on;
                self.save_channel(port, conn, id, vec![entry]).await
            }
            Request::ChannelIcon(icon) => {
                self.set_channel_icon(&mut entry, icon)?;
                self.save_channel(port, conn, id, vec![entry]).await
            }
            Request::ChannelSetAutomation { on } => {
                if entry.is_default {
                    return Err(Refusal::not_found(
                        "the default channel cannot be an automation channel",
                    ));
                }
                if entry.is_thread() {
                    return Err(Refusal::unsupported(
                        "a thread cannot be an automation channel; mark its parent channel",
                    ));
                }
                if on && !entry.automation {
                    let threads = self
                        .store
                        .channels()
                        .map_err(Refusal::internal)?
                        .iter()
                        .filter(|c| c.parent_chat_id.as_deref() == Some(entry.chat_id.as_str()))
                        .count();
                    if threads > 0 {
                        return Err(Refusal::unsupported(format!(
                            "this channel has {threads} thread(s), and an automation channel has \
                             none: delete its threads first"
                        )));
                    }
                }
                entry.automation = on;
                self.save_channel(port, conn, id, vec![entry]).await
            }
            Request::ChannelSetDefault => self.set_default_channel(port, conn, id, entry).await,
            Request::ChannelDelete => self.delete_channel(port, conn, id, entry).await,
            _ => unreachable!("self routes only channel requests here"),
        }
    }

    /// A channel name as stored: trimmed, visible, within `limits.max_name_chars`.
    fn valid_channel_name(&self, name: &str) -> Result<String, Refusal> {
        let name = name.trim();
        let max = self.limits.max_name_chars;
        if is_blank(name) {
            return Err(Refusal::unsupported(
                "a channel name cannot be empty (spaces and invisible characters such as U+200B \
             do not count)",
            ));
        }
        if name.chars().count() > max {
            return Err(Refusal::unsupported(format!(
                "a channel name is at most {max} characters (limits.max_name_chars)"
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(Refusal::unsupported(
                "a channel name cannot contain control characters",
            ));
        }
        Ok(name.to_owned())
    }
}

/// Nothing a person could see or select in a list: only whitespace and invisible characters.
fn is_blank(name: &str) -> bool {
    name.chars().all(|c| c.is_whitespace() || is_invisible(c))
}

/// Format characters (Unicode general category Cf: zero-width spaces and joiners, bidi marks
/// and isolates, the BOM, tags) and the other default-ignorable code points (variation
/// selectors, Hangul fillers, U+034F), none of which draws anything by itself.
fn is_invisible(c: char) -> bool {
    matches!(
        c as u32,
        // Cf, as of Unicode 15.
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            // Default-ignorable but not Cf; the tag and variation-selector block whole.
            | 0x34F
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180D
            | 0x180F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFFA0
            | 0xE0000..=0xE0FFF
    )
}

impl Directory {
    /// Checks and sets a channel icon: an image of a known type within `limits.max_icon_bytes`.
    fn set_channel_icon(&self, entry: &mut Channel, req: ChannelIcon) -> Result<(), Refusal> {
        if let Some(icon) = &req.icon {
            let max = self.limits.max_icon_bytes;
            // Base64 is 4/3 of the bytes: refuse before decoding anything oversized.
            if icon.len() > max / 3 * 4 + 4 {
                return Err(Refusal::unsupported(format!(
                    "the icon is over {max} bytes (limits.max_icon_bytes)"
                )));
            }
            let raw = base64::engine::general_purpose::STANDARD
                .decode(icon.trim())
                .map_err(|e| Refusal::unsupported(format!("the icon is not valid base64: {e}")))?;
            if raw.len() > max {
                return Err(Refusal::unsupported(format!(
                    "the icon is {} bytes, over {max} (limits.max_icon_bytes)",
                    raw.len()
                )));
            }
            let is_png = raw.starts_with(b"\x89PNG\r\n\x1a\n");
            let is_jpeg = raw.starts_with(&[0xff, 0xd8, 0xff]);
            if !(is_png || is_jpeg) {
                return Err(Refusal::unsupported("the icon must be a PNG or JPEG image"));
            }
        }
        if let Some(color) = &req.color {
            let ok = color.len() == 7
                && color.starts_with('#')
                && color[1..].bytes().all(|b| b.is_ascii_hexdigit());
            if !ok {
                return Err(Refusal::unsupported(format!(
                    "color must look like #RRGGBB (got `{}`)",
                    color.chars().take(16).collect::<String>()
                )));
            }
        }
        entry.icon = req.icon;
        entry.color = req.color;
        Ok(())
    }
}

impl Directory {
    /// Stores entries and broadcasts a `channel.renamed` for each; the first answers the request.
    async fn save_channel(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        id: Option<i64>,
        entries: Vec<Channel>,
    ) -> Result<(), Refusal> {
        self.room(&entries)?;
        let mut changes = Vec::new();
        for e in &entries {
            changes.push(Change::PutChannel(e.clone()));
            changes.push(Change::Outbox(
                Frame::channel_entry("channel.renamed", e).outboxed(),
            ));
        }
        let reply = Frame::channel_entry("channel.renamed", &entries[0]).reply_to(id);
        self.commit_directory(port, conn, changes, reply).await
    }

    /// Commits directory changes and answers the requester with the broadcast frame carrying its `id`.
    async fn commit_directory(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        changes: Vec<Change>,
        reply: Frame,
    ) -> Result<(), Refusal> {
        port.commit(
            changes,
            Some(Reply {
                conn,
                at: 0,
                frame: reply,
            }),
        )
        .await
        .map_err(Refusal::from)
    }

    /// `channel.create`: a channel, or a thread under its parent, within the directory's limits.
    async fn create_channel(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        id: Option<i64>,
        envelope_chat: Option<String>,
        req: ChannelCreate,
    ) -> Result<(), Refusal> {
        let name = self.valid_channel_name(&req.name)?;
        let all = self.store.channels().map_err(Refusal::internal)?;
        let max = self.limits.max_channels;
        if all.len() >= max {
            return Err(Refusal::rate_limited(format!("the directory is full ({max} channels and threads, limits.max_channels); delete some first")));
        }
        let wants_thread = req.kind == Some(CreateKind::Thread) || req.parent_chat_id.is_some();
        let entry = if wants_thread {
            let parent_id = req.parent_chat_id.or(envelope_chat).ok_or_else(|| {
                Refusal::not_found("a thread needs parent_chat_id (the channel it belongs to)")
            })?;
            if !is_valid_id(&parent_id) {
                return Err(Refusal::not_found(format!(
                    "no channel `{}`",
                    parent_id.chars().take(64).collect::<String>()
                )));
            }
            let parent = self.channel(&parent_id)?;
            if parent.is_thread() {
                return Err(Refusal::unsupported(
                    "threads cannot nest: use the parent channel as parent_chat_id",
                ));
            }
            if parent.automation {
                return Err(Refusal::unsupported("an automation channel has no threads"));
            }
            new_thread(&parent_id, name, false)
        } else {
            Channel::new(ids::time_ordered("chan"), name, ChannelKind::Channel, None)
        };
        self.room(std::slice::from_ref(&entry))?;
        let changes = vec![
            Change::PutChannel(entry.clone()),
            Change::Outbox(Frame::channel_entry("channel.created", &entry).outboxed()),
        ];
        let reply = Frame::channel_entry("channel.created", &entry).reply_to(id);
        self.commit_directory(port, conn, changes, reply).await
    }
}

/// What an auto-thread is called when its message's first line shows nothing.
const AUTO_THREAD_FALLBACK_NAME: &str = "Thread";

/// A new thread entry under `parent` (`auto` for threads the gateway mints for a message).
pub fn new_thread(parent: &str, name: String, auto: bool) -> Channel {
    // An auto-thread is named from a message, which may start with nothing visible; a name
    // the lists cannot show would leave the thread unfindable.
    let name = if is_blank(&name) {
        AUTO_THREAD_FALLBACK_NAME.to_owned()
    } else {
        name
    };
    let mut thread = Channel::new(
        ids::time_ordered("thr"),
        name,
        ChannelKind::Thread,
        Some(parent.to_owned()),
    );
    thread.auto = auto;
    thread
}

impl Directory {
    /// Moves the default mark: the old default becomes a plain channel in the same commit, so
    /// there is exactly one default at every instant a device or a crash could observe.
    async fn set_default_channel(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        id: Option<i64>,
        mut entry: Channel,
    ) -> Result<(), Refusal> {
        if entry.is_thread() {
            return Err(Refusal::unsupported(
                "a thread cannot be the default channel",
            ));
        }
        if entry.automation {
            return Err(Refusal::unsupported(
                "an automation channel cannot be the default; turn automation off first",
            ));
        }
        let mut entries = Vec::new();
        if !entry.is_default {
            let old = self
                .store
                .channels()
                .map_err(Refusal::internal)?
                .into_iter()
                .find(|c| c.is_default);
            entry.is_default = true;
            entry.kind = ChannelKind::Default;
            entries.push(entry);
            if let Some(mut old) = old {
                old.is_default = false;
                old.kind = ChannelKind::Channel;
                entries.push(old);
            }
        } else {
            entries.push(entry);
        }
        self.save_channel(port, conn, id, entries).await
    }

    /// Deletes a channel with its threads (or one thread) and their history.
    async fn delete_channel(
        &self,
        port: &impl DirectoryPort,
        conn: ConnId,
        id: Option<i64>,
        entry: Channel,
    ) -> Result<(), Refusal> {
        if entry.is_default {
            return Err(Refusal::unsupported(
                "the default channel cannot be deleted; make another channel the default first",
            ));
        }
        let mut doomed: Vec<Channel> = Vec::new();
        if !entry.is_thread() {
            doomed.extend(
                self.store
                    .channels()
                    .map_err(Refusal::internal)?
                    .into_iter()
                    .filter(|c| c.parent_chat_id.as_deref() == Some(entry.chat_id.as_str())),
            );
        }
        doomed.push(entry.clone());
        let mut changes = Vec::new();
        for c in &doomed {
            changes.push(Change::DeleteChannel(c.chat_id.clone()));
            changes.push(Change::Outbox(
                Frame::channel_deleted(&c.chat_id).outboxed(),
            ));
        }
        // History goes first and the directory change after: the directory commit's fsync then
        // covers the purge too. A crash before it leaves the channel in place, partly emptied, and
        // deleting it again (idempotent) finishes the job; never a deleted channel whose messages
        // come back.
        let (chat, thread) = match &entry.parent_chat_id {
            Some(parent) if entry.is_thread() => (parent.as_str(), Some(entry.chat_id.as_str())),
            _ => (entry.chat_id.as_str(), None),
        };
        // The messages go in batches of `limits.max_delete_ids` (as many as one `message.delete`
        // may name, so either costs the event loop the same), each one commit through the committer:
        // what the event loop does per batch is bounded (the outbox frames to tombstone), the
        // history database applies each batch on a worker, and other devices' frames are
        // served between batches, however large the channel.
        let tombstone = |id: &str| Frame::message_deleted(None, &[id.to_owned()]).encode();
        let contents = self
            .store
            .query_lane_contents(chat.to_owned(), thread.map(str::to_owned))
            .await
            .map_err(Refusal::internal)?;
        // Stop the lanes' turns before anything is deleted, so no reply lands in a lane being
        // emptied. (Listed first: with nothing awaited between this and the last commit, a
        // small channel's deletion answers before the abandoned turn's last frames, as it
        // always did.)
        let lanes_gone = port.forget_lanes(&|lane: &Lane| {
            lane.chat_id == chat && (thread.is_none() || lane.thread() == thread)
        });
        let mut media = Vec::new();
        let mut batches = contents
            .chunks(self.limits.max_delete_ids.max(1))
            .peekable();
        let mut last = Vec::new();
        while let Some(batch) = batches.next() {
            let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
            media.extend(batch.iter().flat_map(|(_, m)| m.iter().cloned()));
            if batches.peek().is_none() {
                // The last batch rides with the directory change: a small channel is one
                // commit, as before.
                last = purge_changes(&ids, tombstone);
            } else {
                port.commit(purge_changes(&ids, tombstone), None).await?;
            }
        }
        // Whatever reached the lanes since they were listed goes with the directory change.
        last.push(Change::PurgeHistory {
            chat_id: chat.to_owned(),
            thread_id: thread.map(str::to_owned),
        });
        changes.splice(0..0, last);
        // The lanes' records and queued turns go in the same commit (no outbox frames: the
        // reply's index among the frames stays).
        changes.extend(lanes_gone);
        let reply_at = doomed.len() - 1;
        port.commit(
            changes,
            Some(Reply {
                conn,
                at: reply_at,
                frame: Frame::channel_deleted(&entry.chat_id).reply_to(id),
            }),
        )
        .await?;
        port.collect_media(&media).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_only_spaces_and_invisible_characters_are_blank() {
        for name in [
            "",
            "   ",
            "\u{200B}",
            "\u{200D}\u{FEFF}\u{2060}",
            " \u{200E}\u{200F}\u{202E}\u{2066}\u{2069} ",
            "\u{3164}\u{FE0F}\u{E0041}",
            "\u{00A0}\u{3000}",
        ] {
            assert!(is_blank(name), "{name:?}");
        }
        for name in ["a", "\u{200B}x\u{200B}", "👍\u{FE0F}", "日本"] {
            assert!(!is_blank(name), "{name:?}");
        }
    }

    #[test]
    fn an_invisible_auto_thread_name_is_replaced() {
        assert_eq!(new_thread("c", "\u{200B}".into(), true).name, "Thread");
        assert_eq!(new_thread("c", "Plan".into(), true).name, "Plan");
    }
}
