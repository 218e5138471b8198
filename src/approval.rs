//! A command the agent will only run once a person approves it.
//!
//! Plain data with three users on one tier: the agent reports it (Hermes' approval event),
//! the store keeps it across a restart (src/store/approvals.rs), the hub offers it as a picker.
//! Services may not import each other, so it lives below them; it is not a frame of the app's
//! protocol (the picker is), so it does not live in `protocol`.

/// A command the agent will only run once a person approves it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalRequest {
    /// The command, as the agent shows it (credentials already redacted by Hermes).
    pub command: String,
    /// Why it is flagged ("delete in root path").
    pub description: String,
    /// The answers the agent accepts: a subset of `once`, `session`, `always`, `deny`.
    pub choices: Vec<String>,
}
