//! The user's choices and the pickers that offer them: `/reasoning` and `/fast` for every lane,
//! `/model` and `/voice` per lane (all also in the store, written through the port's commit), and the settings
//! pickers waiting for an answer (memory only: a restart expires them). Its one owner.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::errors::CommitError;
use super::port::Port;
use crate::agent::AgentSettings;
use crate::protocol::Lane;
use crate::store::{Change, LaneModel, Record, VoiceMode};

/// Pickers waiting for an answer; the oldest is forgotten beyond this.
const MAX_PENDING_PICKERS: usize = 32;
/// A picker not answered within this is forgotten.
const PICKER_TTL: Duration = Duration::from_secs(15 * 60);

pub(super) struct Choices {
    inner: RefCell<Inner>,
}

struct Inner {
    settings: AgentSettings,
    lane_models: HashMap<Lane, LaneModel>,
    /// Lanes whose voice mode is not off.
    lane_voices: HashMap<Lane, VoiceMode>,
    pickers: HashMap<String, Picker>,
}

impl Choices {
    pub(super) fn new(
        settings: AgentSettings,
        lane_models: Vec<(Lane, LaneModel)>,
        lane_voices: Vec<(Lane, VoiceMode)>,
    ) -> Choices {
        Choices {
            inner: RefCell::new(Inner {
                settings,
                lane_models: lane_models.into_iter().collect(),
                lane_voices: lane_voices.into_iter().collect(),
                pickers: HashMap::new(),
            }),
        }
    }

    /// The household's settings (a model here is one chosen before models were per lane).
    pub(super) fn settings(&self) -> AgentSettings {
        self.inner.borrow().settings.clone()
    }

    /// Stores the household's settings through the port, then keeps them.
    pub(super) async fn store_settings(
        &self,
        port: &impl Port,
        settings: AgentSettings,
    ) -> Result<(), CommitError> {
        let put = Change::Record(Record::PutAgentSettings(settings.clone()));
        port.commit(vec![put], None).await?;
        self.inner.borrow_mut().settings = settings;
        Ok(())
    }

    /// The settings a turn in `lane` runs with: the household's reasoning and speed, and the
    /// lane's model where one was chosen there.
    pub(super) fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        let mut settings = self.settings();
        if let Some(m) = self.lane_model(lane) {
            settings.model = Some(m.model);
            settings.provider = m.provider;
        }
        settings
    }

    pub(super) fn lane_model(&self, lane: &Lane) -> Option<LaneModel> {
        self.inner.borrow().lane_models.get(lane).cloned()
    }

    /// Sets (or, with `None`, clears) the lane's model once it is on disk.
    pub(super) async fn store_lane_model(
        &self,
        port: &impl Port,
        lane: &Lane,
        choice: Option<LaneModel>,
    ) -> Result<(), CommitError> {
        let change = Change::SetLaneModel(lane.clone(), choice.clone());
        port.commit(vec![change], None).await?;
        let mut i = self.inner.borrow_mut();
        match choice {
            Some(c) => i.lane_models.insert(lane.clone(), c),
            None => i.lane_models.remove(lane),
        };
        Ok(())
    }

    /// The lane's voice mode (`Off` unless `/voice` chose another).
    pub(super) fn lane_voice(&self, lane: &Lane) -> VoiceMode {
        let i = self.inner.borrow();
        i.lane_voices.get(lane).copied().unwrap_or(VoiceMode::Off)
    }

    pub(super) fn set_lane_voice(&self, lane: &Lane, mode: VoiceMode) {
        let mut i = self.inner.borrow_mut();
        match mode {
            VoiceMode::Off => i.lane_voices.remove(lane),
            other => i.lane_voices.insert(lane.clone(), other),
        };
    }

    /// Deleted lanes' choices leave memory (the store drops them with the channel).
    pub(super) fn forget_lanes(&self, gone: &impl Fn(&Lane) -> bool) {
        let mut i = self.inner.borrow_mut();
        i.lane_models.retain(|l, _| !gone(l));
        i.lane_voices.retain(|l, _| !gone(l));
    }

    /// Remembers an offered picker under `id`; expired ones go, and past the cap the oldest.
    pub(super) fn open_picker(&self, id: String, picker: Picker) {
        let mut i = self.inner.borrow_mut();
        i.pickers.retain(|_, p| p.created.elapsed() < PICKER_TTL);
        if i.pickers.len() >= MAX_PENDING_PICKERS {
            let oldest = i
                .pickers
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                i.pickers.remove(&k);
            }
        }
        i.pickers.insert(id, picker);
    }

    /// What the open picker `id` sets, without answering it.
    pub(super) fn picker_setting(&self, id: &str) -> Option<Setting> {
        self.inner
            .borrow()
            .pickers
            .get(id)
            .map(|p| p.setting.clone())
    }

    /// The picker `id` answers, if it is still open (each is answered once).
    pub(super) fn take_picker(&self, id: &str) -> Option<Picker> {
        let mut i = self.inner.borrow_mut();
        i.pickers.retain(|_, p| p.created.elapsed() < PICKER_TTL);
        i.pickers.remove(id)
    }
}

/// A picker waiting for `picker.select`.
pub(super) struct Picker {
    pub(super) lane: Lane,
    pub(super) setting: Setting,
    pub(super) created: Instant,
}

impl Picker {
    /// A picker offered now, for `Choices::open_picker`.
    pub(super) fn new(lane: &Lane, setting: Setting) -> Picker {
        Picker {
            lane: lane.clone(),
            setting,
            created: Instant::now(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Setting {
    Reasoning,
    Fast,
    Model,
    /// `/jobs`: which of the agent's jobs (`jobs.rs`).
    Job,
    /// What to do to the agent's job with this id.
    JobAction(String),
}
