//! The agent a start runs when the saved agent settings cannot work: it answers no turn, and
//! says why, until the admin page's Agent form puts a working backend in its place (the
//! gateway itself stays up to serve that page).

use tokio::sync::mpsc;

use super::{Agent, AgentError, AgentEvent, LocalBoxFuture, TurnInput, TurnSummary};

pub struct OffAgent {
    why: String,
}

impl OffAgent {
    pub fn new(why: String) -> OffAgent {
        OffAgent { why }
    }
}

impl Agent for OffAgent {
    fn name(&self) -> &'static str {
        "off"
    }

    fn describe(&self) -> String {
        "off (its saved settings cannot work)".to_owned()
    }

    fn can_pick_model(&self) -> bool {
        false
    }

    // Not `Unreachable`: a turn would wait for an agent that cannot come back by itself.
    fn run_turn(
        &self,
        _turn: TurnInput,
        _events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        let why = format!(
            "the agent is off: {}; set it on the admin page's Agent page",
            self.why
        );
        Box::pin(async move { Err(AgentError::Failed(why)) })
    }
}
