//! The agent side of each lane: which conversation (a Hermes session) it continues, and the
//! user's slash-command choices. Small records, written when they change and flushed at once:
//! losing one to a power cut would silently start a fresh conversation.

use serde::{Deserialize, Serialize};

use super::history::lane_prefix;
use super::{from_json, to_json, Result, Store};
use crate::config::AgentSettings;
use crate::protocol::Lane;

const META_AGENT_SETTINGS: &[u8] = b"agent_settings";

/// A lane's conversation at the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSession {
    /// Sent as `X-Hermes-Session-Id`; path-safe (`iris-` and hex).
    pub session_id: String,
    /// When it began (epoch ms): backends that keep no history get the messages since then.
    pub started_ms: i64,
}

impl Store {
    pub fn agent_session(&self, lane: &Lane) -> Result<Option<AgentSession>> {
        match self.t()?.sessions.get(lane_prefix(lane))? {
            Some(v) => Ok(Some(from_json(&v, "agent session")?)),
            None => Ok(None),
        }
    }

    /// Records the lane's (new) conversation. Without a flush of its own: the turn that starts
    /// it makes a durable commit before any device hears of its answer (its `tool.end` or
    /// `message.stop`), and that fsync covers this write too. A crash before then loses only
    /// the session id, which no device was told of; the lane's next turn starts a new one.
    pub async fn put_agent_session(&self, lane: &Lane, session: &AgentSession) -> Result<()> {
        self.writable()?;
        self.t()?
            .sessions
            .insert(lane_prefix(lane), to_json(session))?;
        Ok(())
    }

    /// The lane was deleted: its conversation goes with it.
    pub fn remove_agent_session(&self, lane: &Lane) -> Result<()> {
        self.writable()?;
        self.t()?.sessions.remove(lane_prefix(lane))?;
        Ok(())
    }

    pub fn agent_settings(&self) -> Result<AgentSettings> {
        match self.t()?.meta.get(META_AGENT_SETTINGS)? {
            Some(v) => from_json(&v, "agent settings"),
            None => Ok(AgentSettings::default()),
        }
    }

    pub async fn put_agent_settings(&self, settings: &AgentSettings) -> Result<()> {
        self.writable()?;
        self.t()?
            .meta
            .insert(META_AGENT_SETTINGS, to_json(settings))?;
        self.sync().await?;
        Ok(())
    }
}
