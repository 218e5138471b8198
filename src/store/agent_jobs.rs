//! The agent's scheduled jobs the gateway delivers: which lane each job's results go to, and
//! the newest run already delivered, so each run reaches the phones once across restarts.
//!
//! Small records in the `meta` tree under their own key prefix (no new tree), written through
//! a commit (`Record::PutAgentJob`): a run's message and the job's new mark are one commit, so a
//! crash either delivered the run and moved the mark, or did neither.

use serde::{Deserialize, Serialize};

use super::base::{from_json, Result};
use super::engine::handle::Store;
use crate::protocol::Lane;

const AGENT_JOB_PREFIX: &[u8] = b"agent_job/";

/// One agent job the gateway knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentJob {
    /// The agent's id of the job (Hermes: 12 hex digits).
    pub job_id: String,
    /// The lane the job was made in; `None`: made outside Iris, its results go to the
    /// agent-jobs automation channel.
    pub lane: Option<Lane>,
    /// The newest run already delivered (the agent's stamp of it, ordered as text: Hermes'
    /// output file name); `None` before the first.
    pub delivered: Option<String>,
}

/// Where a job's record is kept.
pub(super) fn agent_job_key(job_id: &str) -> Vec<u8> {
    [AGENT_JOB_PREFIX, job_id.as_bytes()].concat()
}

impl Store {
    pub fn agent_jobs(&self) -> Result<Vec<AgentJob>> {
        self.t()?
            .meta
            .scan_prefix(AGENT_JOB_PREFIX)
            .values()
            .map(|v| from_json(&v?, "agent job"))
            .collect()
    }
}
