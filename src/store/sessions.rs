//! The agent side of each lane: which conversation (a Hermes session) it continues, and the
//! user's slash-command choices. Small records, written when they change and flushed at once:
//! losing one to a power cut would silently start a fresh conversation.

use serde::{Deserialize, Serialize};

use super::base::{from_json, Result};
use super::engine::handle::Store;
use super::keys::lane_prefix;
use crate::config::AgentSettings;
use crate::protocol::Lane;

pub(super) const META_AGENT_SETTINGS: &[u8] = b"agent_settings";

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

    pub fn agent_settings(&self) -> Result<AgentSettings> {
        match self.t()?.meta.get(META_AGENT_SETTINGS)? {
            Some(v) => from_json(&v, "agent settings"),
            None => Ok(AgentSettings::default()),
        }
    }
}
