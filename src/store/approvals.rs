//! Agent runs in flight and the approvals they wait for, so a gateway restart can find both
//! again: the run is followed to its end (its answer delivered once) and a still-waiting
//! approval stays answerable through the picker every device already has.
//!
//! Small records in the `meta` tree under their own key prefixes (no new tree: the layout
//! stays as it is), written through a commit (`Record::PutRun`, `Record::PutApproval`, …:
//! records.rs) when they change, durable before anyone is told about them.

use serde::{Deserialize, Serialize};

use super::base::{from_json, Result};
use super::engine::handle::Store;
use crate::approval::ApprovalRequest;
use crate::protocol::Lane;

const RUN_PREFIX: &[u8] = b"run/";
const APPROVAL_PREFIX: &[u8] = b"approval/";

/// A run the agent took for a user message (`RunStarted`): kept until the turn is settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub user_message_id: String,
    pub lane: Lane,
    pub run_id: String,
}

/// An approval offered as a picker and not answered yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub picker_id: String,
    pub lane: Lane,
    pub run_id: String,
    pub request: ApprovalRequest,
    pub created_ms: i64,
}

fn key(prefix: &[u8], id: &str) -> Vec<u8> {
    [prefix, id.as_bytes()].concat()
}

/// Where a user message's run is kept.
pub(super) fn run_key(user_message_id: &str) -> Vec<u8> {
    key(RUN_PREFIX, user_message_id)
}

/// Where an open approval is kept.
pub(super) fn approval_key(picker_id: &str) -> Vec<u8> {
    key(APPROVAL_PREFIX, picker_id)
}

impl Store {
    /// The run of a user message's turn, if the agent took it as one.
    pub fn run_of(&self, user_message_id: &str) -> Result<Option<RunRecord>> {
        match self.t()?.meta.get(key(RUN_PREFIX, user_message_id))? {
            Some(v) => Ok(Some(from_json(&v, "agent run")?)),
            None => Ok(None),
        }
    }

    pub fn runs(&self) -> Result<Vec<RunRecord>> {
        self.t()?
            .meta
            .scan_prefix(RUN_PREFIX)
            .values()
            .map(|v| from_json(&v?, "agent run"))
            .collect()
    }

    pub fn approvals(&self) -> Result<Vec<ApprovalRecord>> {
        self.t()?
            .meta
            .scan_prefix(APPROVAL_PREFIX)
            .values()
            .map(|v| from_json(&v?, "approval"))
            .collect()
    }
}
