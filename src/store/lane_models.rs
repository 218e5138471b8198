//! Each lane's model, as `/model` in that lane chose it, and its voice mode, as `/voice` chose
//! it: one small record per lane each, written only through `commit` (`Change::SetLaneModel`,
//! `Change::SetLaneVoice`), removed with the lane's channel or thread.

use serde::{Deserialize, Serialize};

use super::base::Result;
use super::engine::handle::Store;
use super::keys::{lane_prefix, per_lane};
use crate::protocol::Lane;

/// The model a lane's turns ask for, and the provider that serves it where the agent lists
/// models per provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneModel {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// Whether a lane's answers are also spoken (`/voice`): always, never, or when the message
/// they answer was a voice note. A lane without a record is `Off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VoiceMode {
    On,
    Off,
    Auto,
}

impl VoiceMode {
    /// `on`, `off`, `auto`: as `/voice` takes and shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            VoiceMode::On => "on",
            VoiceMode::Off => "off",
            VoiceMode::Auto => "auto",
        }
    }
}

impl Store {
    /// Every lane's chosen model (one record per lane; lanes are bounded by the directory).
    pub fn lane_models(&self) -> Result<Vec<(Lane, LaneModel)>> {
        per_lane(&self.t()?.lane_models, "lane model")
    }

    /// Every lane's voice mode other than off (one record per lane).
    pub fn lane_voices(&self) -> Result<Vec<(Lane, VoiceMode)>> {
        per_lane(&self.t()?.lane_voices, "lane voice mode")
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

    #[test]
    fn a_lane_keeps_its_voice_mode_across_a_reopen_until_cleared_or_deleted() {
        let (dir, store) = temp_store();
        let flat = Lane::new("default", None);
        let thread = Lane::new("default", Some("thr_1"));
        store
            .commit(&[
                Change::SetLaneVoice(flat.clone(), Some(VoiceMode::On)),
                Change::SetLaneVoice(flat.clone(), Some(VoiceMode::Auto)),
                Change::SetLaneVoice(thread.clone(), Some(VoiceMode::On)),
            ])
            .unwrap();
        store.sync_blocking().unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1 << 20, std::time::Duration::from_secs(1)).unwrap();
        let mut voices = store.lane_voices().unwrap();
        voices.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            voices,
            vec![(flat.clone(), VoiceMode::Auto), (thread, VoiceMode::On)]
        );
        store
            .commit(&[Change::DeleteChannel("thr_1".into())])
            .unwrap();
        assert_eq!(
            store.lane_voices().unwrap(),
            vec![(flat.clone(), VoiceMode::Auto)]
        );
        store.commit(&[Change::SetLaneVoice(flat, None)]).unwrap();
        assert!(store.lane_voices().unwrap().is_empty());
    }
}
