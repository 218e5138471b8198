//! Each lane's model (`/model` in that lane): one choice per lane, kept in memory for the
//! lane's turns and on disk through the committer, gone with the lane's channel or thread.

use crate::agent::AgentSettings;
use crate::protocol::Lane;
use crate::store::{Change, LaneModel};

use super::errors::CommitError;
use super::state::Hub;

impl Hub {
    /// The model chosen in `lane`, if any.
    pub(super) fn lane_model(&self, lane: &Lane) -> Option<LaneModel> {
        self.state.borrow().lane_models.get(lane).cloned()
    }

    /// Sets (or, with `None`, clears) the lane's model once it is on disk.
    pub(super) async fn set_lane_model(
        &self,
        lane: &Lane,
        choice: Option<LaneModel>,
    ) -> Result<(), CommitError> {
        self.commit(
            vec![Change::SetLaneModel(lane.clone(), choice.clone())],
            None,
        )
        .await?;
        let mut st = self.state.borrow_mut();
        match choice {
            Some(c) => st.lane_models.insert(lane.clone(), c),
            None => st.lane_models.remove(lane),
        };
        Ok(())
    }

    /// The settings a turn in `lane` runs with: the household's reasoning and speed, and the
    /// lane's model where one was chosen there.
    pub(super) fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        let mut settings = self.state.borrow().agent_settings.clone();
        if let Some(m) = self.lane_model(lane) {
            settings.model = Some(m.model);
            settings.provider = m.provider;
        }
        settings
    }

    /// Deleted lanes' choices leave memory (the store drops them with the channel).
    pub(super) fn forget_lane_models(&self, gone: &impl Fn(&Lane) -> bool) {
        self.state.borrow_mut().lane_models.retain(|l, _| !gone(l));
    }
}
