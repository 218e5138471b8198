//! User messages whose agent turn has not finished yet: kept by `Change::BeginTurn` until
//! `Change::EndTurn`, so a start after a crash can close each one as interrupted.

use serde::Serialize;

use super::base::{from_json, Result};
use super::engine::handle::Store;
use crate::protocol::Lane;

/// A user message whose agent turn has not finished yet.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PendingTurn {
    pub user_message_id: String,
    pub lane: Lane,
    pub text: String,
}

impl Store {
    /// User messages whose turns never finished (the gateway stopped mid-turn).
    pub fn pending_turns(&self) -> Result<Vec<PendingTurn>> {
        self.t()?
            .turns
            .iter()
            .values()
            .map(|v| from_json(&v?, "pending turn"))
            .collect()
    }
}
