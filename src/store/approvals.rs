//! Agent runs in flight and the approvals they wait for, so a gateway restart can find both
//! again: the run is followed to its end (its answer delivered once) and a still-waiting
//! approval stays answerable through the picker every device already has.
//!
//! Small records in the `meta` tree under their own key prefixes (no new tree: the layout
//! stays as it is), written when they change and flushed before anyone is told about them.

use serde::{Deserialize, Serialize};

use super::{from_json, to_json, Result, Store};
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

impl Store {
    /// Records a run, durably before the gateway relies on finding it after a crash.
    pub async fn put_run(&self, run: &RunRecord) -> Result<()> {
        self.writable()?;
        self.t()?
            .meta
            .insert(key(RUN_PREFIX, &run.user_message_id), to_json(run))?;
        self.sync().await
    }

    /// The run of a user message's turn, if the agent took it as one.
    pub fn run_of(&self, user_message_id: &str) -> Result<Option<RunRecord>> {
        match self.t()?.meta.get(key(RUN_PREFIX, user_message_id))? {
            Some(v) => Ok(Some(from_json(&v, "agent run")?)),
            None => Ok(None),
        }
    }

    /// The turn is settled. Not flushed: a run left behind by a crash is dropped at the next
    /// start (its turn is no longer pending).
    pub fn remove_run(&self, user_message_id: &str) -> Result<()> {
        self.writable()?;
        self.t()?.meta.remove(key(RUN_PREFIX, user_message_id))?;
        Ok(())
    }

    pub fn runs(&self) -> Result<Vec<RunRecord>> {
        self.t()?
            .meta
            .scan_prefix(RUN_PREFIX)
            .values()
            .map(|v| from_json(&v?, "agent run"))
            .collect()
    }

    /// Records an approval, durably before its picker goes out.
    pub async fn put_approval(&self, a: &ApprovalRecord) -> Result<()> {
        self.writable()?;
        self.t()?
            .meta
            .insert(key(APPROVAL_PREFIX, &a.picker_id), to_json(a))?;
        self.sync().await
    }

    /// The approval is answered or closed. Flushed: a closed approval must not come back
    /// answerable after a crash.
    pub async fn remove_approval(&self, picker_id: &str) -> Result<()> {
        self.writable()?;
        self.t()?.meta.remove(key(APPROVAL_PREFIX, picker_id))?;
        self.sync().await
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
