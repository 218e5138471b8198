//! Each lane's model, as `/model` in that lane chose it: one small record per lane, written
//! only through `commit` (`Change::SetLaneModel`), removed with the lane's channel or thread.

use serde::{Deserialize, Serialize};

use super::history::{lane_prefix, per_lane};
use super::{Result, Store};
use crate::protocol::Lane;

/// The model a lane's turns ask for, and the provider that serves it where the agent lists
/// models per provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneModel {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

impl Store {
    /// Every lane's chosen model (one record per lane; lanes are bounded by the directory).
    pub fn lane_models(&self) -> Result<Vec<(Lane, LaneModel)>> {
        per_lane(&self.t()?.lane_models, "lane model")
    }
}

/// The record's key: the lane's, as the other per-lane trees have it.
pub(super) fn key(lane: &Lane) -> Vec<u8> {
    lane_prefix(lane)
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_store;
    use super::super::Change;
    use super::*;

    fn choice(model: &str) -> LaneModel {
        LaneModel {
            model: model.into(),
            provider: Some("custom".into()),
        }
    }

    #[test]
    fn a_lane_keeps_its_model_across_a_reopen_until_cleared_or_deleted() {
        let (dir, store) = temp_store();
        let flat = Lane::new("default", None);
        let thread = Lane::new("default", Some("thr_1"));
        let other = Lane::new("chan_2", None);
        store
            .commit(&[
                Change::SetLaneModel(flat.clone(), Some(choice("a"))),
                Change::SetLaneModel(flat.clone(), Some(choice("b"))),
                Change::SetLaneModel(thread.clone(), Some(choice("c"))),
                Change::SetLaneModel(other.clone(), Some(choice("d"))),
            ])
            .unwrap();
        store.sync_blocking().unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1 << 20, std::time::Duration::from_secs(1)).unwrap();
        let mut models = store.lane_models().unwrap();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            models,
            vec![
                (other.clone(), choice("d")),
                (flat.clone(), choice("b")),
                (thread, choice("c")),
            ]
        );
        store
            .commit(&[
                Change::SetLaneModel(flat, None),
                Change::DeleteChannel("thr_1".into()),
            ])
            .unwrap();
        assert_eq!(store.lane_models().unwrap(), vec![(other, choice("d"))]);
    }
}
