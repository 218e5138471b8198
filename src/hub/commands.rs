//! Slash commands the gateway answers itself, and the pickers some of them open.
//!
//! A command arrives as an ordinary `message.send` whose text starts with a known `/name`: the
//! message is stored and echoed like any other (every device sees what was asked), then the
//! gateway answers with a `system` message in the same chat. It is never sent to the agent.
//! Unknown slash text is not a command here: it goes to the agent as typed, so the agent's
//! own commands keep working.
//!
//! Finite choices (`/reasoning`, `/fast`, `/model` without an argument) open a picker: an
//! outboxed `picker.choice`, answered by `picker.select`. Pending pickers live in memory only
//! (the schema says a restart expires them); unknown or expired ids are a no-op.

pub(super) mod catalog;

use std::rc::Rc;

use serde_json::{json, Value};
use tracing::warn;

use super::agent_calls::CallKind;
use super::choices::{Choices, Picker, Setting};
use super::errors::Refusal;
use super::jobs::JobsOffer;
use super::port::Port;
use super::StatusReport;
use crate::agent::{Agent, AgentSettings};
use crate::ids;
use crate::protocol::{Frame, HistoryMessage, Lane, Role};
use crate::store::{Change, LaneModel, VoiceMode};

use self::catalog::SPECS;
pub use self::catalog::{parse, Command};

/// The reasoning efforts offered (`default` leaves the agent's own setting).
const REASONING_LEVELS: [&str; 5] = ["default", "none", "low", "medium", "high"];

/// What the gateway's commands ask of the hub beyond the core: the lanes' turns (`/new`,
/// `/stop`, `/voice`), the agent's jobs (`/jobs`) and the figures `/status` shows.
#[allow(async_fn_in_trait)]
pub(super) trait CommandsPort: Port {
    /// Starts a fresh conversation in `lane` (`/new`: the turns' new agent session and plan).
    async fn new_conversation(&self, lane: &Lane);

    /// Stops the running turn of `lane`; `false` when nothing runs there.
    fn stop_turn(&self, lane: &Lane) -> bool;

    /// `/voice on|off|auto` in `lane`, answered in words.
    async fn set_voice_mode(&self, lane: &Lane, value: &str) -> String;

    /// Where answers are spoken now, or `None` when no speech service is set.
    fn speech_service(&self) -> Option<String>;

    /// Offers the agent's jobs in `lane` (`/jobs`: a picker, or a sentence saying why not).
    async fn offer_jobs(&self, lane: &Lane);

    /// Offers in `lane` what can be done to the job `job_id` a picker's answer chose.
    async fn offer_job_actions(&self, lane: &Lane, job_id: &str);

    /// Does `value` (pause, resume, run, remove) to the agent's job `job_id`; says how it went.
    async fn apply_job_action(&self, job_id: &str, value: &str) -> String;

    /// The gateway's health and figures, as `iris-gateway status` reports them.
    fn status_report(&self) -> StatusReport;

    /// Approvals waiting for an answer.
    fn approvals_waiting(&self) -> usize;
}

/// The gateway's own commands and the settings pickers they open: the behaviour on the user's
/// choices, which it owns (`choices.rs`). The router hands it commands and picker answers; the
/// rest of the hub it reaches through the port (a fresh conversation, the jobs' offers, the
/// status report).
pub(super) struct Commands {
    choices: Choices,
    agent: Rc<dyn Agent>,
}

impl Commands {
    pub(super) fn new(choices: Choices, agent: Rc<dyn Agent>) -> Commands {
        Commands { choices, agent }
    }

    /// The catalog for the app's `/` drawer.
    pub(super) fn catalog(&self) -> Value {
        let can_pick_model = self.agent.can_pick_model();
        Value::Array(
            SPECS
                .iter()
                .filter(|s| can_pick_model || !s.needs_models)
                .map(|s| {
                    json!({
                        "name": s.name,
                        "description": s.description,
                        "args_hint": s.args_hint,
                        "category": s.category,
                        "aliases": s.aliases,
                    })
                })
                .collect(),
        )
    }

    /// Runs a command sent in `lane` and posts the gateway's answer there.
    pub(super) async fn execute(&self, hub: &impl CommandsPort, lane: &Lane, command: Command) {
        let answer = match command {
            Command::New => {
                hub.new_conversation(lane).await;
                "Started a new conversation: the agent will not see the earlier messages of this chat."
                .to_owned()
            }
            Command::Stop => {
                if hub.stop_turn(lane) {
                    "Stopped the agent's answer.".to_owned()
                } else {
                    "Nothing is running in this chat.".to_owned()
                }
            }
            Command::Help => self.help_text(),
            Command::Status => self.status_text(hub, lane),
            Command::Reasoning(None) => return self.open_picker(hub, lane, Setting::Reasoning).await,
            Command::Fast(None) => return self.open_picker(hub, lane, Setting::Fast).await,
            Command::Model(None) => return self.open_picker(hub, lane, Setting::Model).await,
            Command::Jobs => return hub.offer_jobs(lane).await,
            Command::Reasoning(Some(v)) => self.apply_setting(hub, lane, Setting::Reasoning, &v).await,
            Command::Fast(Some(v)) => self.apply_setting(hub, lane, Setting::Fast, &v).await,
            Command::Model(Some(v)) => self.apply_setting(hub, lane, Setting::Model, &v).await,
            // `/steer TEXT` never gets here (`Messages::send` hands it to `Messages::steer`).
            Command::Voice(Some(v)) => hub.set_voice_mode(lane, &v).await,
            Command::Voice(None) => format!(
                "Voice in this chat: {}. Say `/voice on`, `/voice off` or `/voice auto` (answers to voice notes).",
                self.choices.lane_voice(lane).as_str()
            ),
            Command::Steer(_) => {
                "Say `/steer` and the guidance, e.g. `/steer keep it short`: the running answer takes it without stopping.".to_owned()
            }
        };
        post_system(hub, lane, answer).await;
    }

    /// Answers a picker. Unknown or expired ids are a no-op, as the schema says.
    pub(super) async fn select(
        &self,
        hub: &impl CommandsPort,
        picker_id: &str,
        value: &str,
    ) -> Result<(), Refusal> {
        let picker = self.choices.take_picker(picker_id);
        if let Some(p) = picker {
            if hub.lane_exists(&p.lane) {
                let answer = match p.setting {
                    Setting::Job => {
                        hub.offer_job_actions(&p.lane, value).await;
                        return Ok(());
                    }
                    Setting::JobAction(job_id) => hub.apply_job_action(&job_id, value).await,
                    setting => self.apply_setting(hub, &p.lane, setting, value).await,
                };
                post_system(hub, &p.lane, answer).await;
            }
        }
        Ok(())
    }

    /// Changes one setting from a command argument or a picker value; returns what to tell the
    /// user. Reasoning and speed apply to every lane; a model to `lane` only.
    async fn apply_setting(
        &self,
        hub: &impl CommandsPort,
        lane: &Lane,
        setting: Setting,
        value: &str,
    ) -> String {
        let value = value.trim();
        if setting == Setting::Model {
            return self.choose_lane_model(hub, lane, value).await;
        }
        let mut settings = self.choices.settings();
        let answer = match setting {
            Setting::Reasoning => {
                let v = value.to_ascii_lowercase();
                if !REASONING_LEVELS.contains(&v.as_str()) {
                    return format!(
                        "`{}` is not a reasoning level; choose one of: {}.",
                        shorten(value),
                        REASONING_LEVELS.join(", ")
                    );
                }
                settings.reasoning = (v != "default").then(|| v.clone());
                self.with_note(format!("Reasoning effort: {v}."))
            }
            Setting::Fast => {
                let on = match value.to_ascii_lowercase().as_str() {
                    "on" | "true" | "yes" | "1" => true,
                    "off" | "false" | "no" | "0" => false,
                    _ => return format!("`{}`: say `/fast on` or `/fast off`.", shorten(value)),
                };
                settings.fast = on;
                self.with_note(format!("Fast mode {}.", if on { "on" } else { "off" }))
            }
            Setting::Model | Setting::Job | Setting::JobAction(_) => {
                unreachable!("a model is chosen per lane; jobs are changed at the agent")
            }
        };
        if let Err(e) = self.choices.store_settings(hub, settings).await {
            warn!("could not store the agent settings: {e}");
            return format!("Could not save the setting: {e}.");
        }
        answer
    }

    /// `/model NAME` (or a picker's value) in `lane`: the lane's next turns ask for that model;
    /// `default` goes back to the agent's own.
    async fn choose_lane_model(&self, hub: &impl CommandsPort, lane: &Lane, value: &str) -> String {
        let models = match self.agent.models().await {
            Ok(m) if !m.is_empty() => m,
            Ok(_) => return "This agent does not offer a choice of model.".into(),
            Err(e) => return format!("Could not ask the agent for its models: {e}."),
        };
        let (choice, answer) = if value.eq_ignore_ascii_case("default") {
            (None, "Model in this chat: the agent's default.".to_owned())
        } else if let Some(m) = models.iter().find(|m| m.is_named(value)) {
            let choice = LaneModel {
                model: m.model.clone(),
                provider: m.provider.clone(),
            };
            (Some(choice), format!("Model in this chat: {}.", m.model))
        } else {
            let offered: Vec<String> = models.iter().take(30).map(|m| m.value()).collect();
            return format!(
                "The agent has no model `{}`; it offers: {}.",
                shorten(value),
                offered.join(", ")
            );
        };
        if let Err(e) = self
            .choices
            .store_lane_model(hub, lane, choice.clone())
            .await
        {
            warn!(%lane, "could not store the lane's model: {e}");
            return format!("Could not save the setting: {e}.");
        }
        // A household-wide model from before choices were per lane would otherwise outlive
        // every `/model default`.
        let old = self.choices.settings();
        if choice.is_none() && old.model.is_some() {
            let settings = AgentSettings {
                model: None,
                provider: None,
                ..old
            };
            if let Err(e) = self.choices.store_settings(hub, settings).await {
                warn!("could not store the agent settings: {e}");
                return format!("Could not save the setting: {e}.");
            }
        }
        answer
    }

    /// Offers a setting's choices as an outboxed `picker.choice` in `lane`.
    async fn open_picker(&self, hub: &impl CommandsPort, lane: &Lane, setting: Setting) {
        let current = self.choices.settings();
        let (title, choices) = match setting {
            Setting::Reasoning => (
                "Reasoning effort",
                REASONING_LEVELS
                    .iter()
                    .map(|l| {
                        let is_current = current.reasoning.as_deref().unwrap_or("default") == *l;
                        (l.to_string(), capitalised(l), is_current)
                    })
                    .collect::<Vec<_>>(),
            ),
            Setting::Fast => (
                "Fast mode",
                vec![
                    ("on".into(), "On".into(), current.fast),
                    ("off".into(), "Off".into(), !current.fast),
                ],
            ),
            Setting::Model => {
                let models = match self.agent.models().await {
                    Ok(m) if !m.is_empty() => m,
                    Ok(_) => {
                        let text = "This agent does not offer a choice of model.".to_owned();
                        return post_system(hub, lane, text).await;
                    }
                    Err(e) => {
                        let text = format!("Could not ask the agent for its models: {e}.");
                        return post_system(hub, lane, text).await;
                    }
                };
                let chosen = self.choices.lane_model(lane);
                let mut choices = vec![(
                    "default".to_owned(),
                    "Agent default".to_owned(),
                    chosen.is_none(),
                )];
                // The provider is named only where the list spans more than one.
                let several = models.iter().any(|m| m.provider != models[0].provider);
                choices.extend(models.into_iter().take(30).map(|m| {
                    let is_current = chosen.as_ref().is_some_and(|c| {
                        c.model == m.model && (c.provider.is_none() || c.provider == m.provider)
                    });
                    let label = match (&m.provider, several) {
                        (Some(p), true) => format!("{} ({p})", m.model),
                        _ => m.model.clone(),
                    };
                    (m.value(), label, is_current)
                }));
                ("Model", choices)
            }
            Setting::Job | Setting::JobAction(_) => return hub.offer_jobs(lane).await,
        };
        let choices: Vec<Value> = choices
        .into_iter()
        .map(|(value, label, is_current)| {
            json!({ "value": value, "label": label, "is_current": is_current })
        })
        .collect();
        self.offer_picker(hub, lane, title, choices, setting).await;
    }

    /// Sends a picker in `lane` and remembers what answering it means.
    pub(super) async fn offer_picker(
        &self,
        hub: &impl CommandsPort,
        lane: &Lane,
        title: &str,
        choices: Vec<Value>,
        setting: Setting,
    ) {
        let picker_id = ids::time_ordered("pk");
        let frame = Frame::picker_choice(&picker_id, title, Value::Array(choices))
            .in_lane(&lane.chat_id, lane.thread());
        self.choices
            .open_picker(picker_id, Picker::new(lane, setting));
        if let Err(e) = hub
            .commit(vec![Change::Outbox(frame.outboxed())], None)
            .await
        {
            warn!(%lane, "could not send a picker: {e}");
        }
    }

    /// Says or offers what the agent's jobs answer in `lane`.
    pub(super) async fn offer(&self, hub: &impl CommandsPort, lane: &Lane, offer: JobsOffer) {
        match offer {
            JobsOffer::Say(text) => post_system(hub, lane, text).await,
            JobsOffer::Pick {
                title,
                choices,
                setting,
            } => self.offer_picker(hub, lane, &title, choices, setting).await,
        }
    }

    /// `/help`: the gateway's own commands, from the same table as the catalog.
    fn help_text(&self) -> String {
        let can_pick_model = self.agent.can_pick_model();
        let mut out = String::from("Commands the gateway answers:");
        for s in SPECS.iter().filter(|s| can_pick_model || !s.needs_models) {
            out.push_str(&format!("\n{} {}", s.name, s.args_hint));
            let out_len = out.trim_end().len();
            out.truncate(out_len);
            if !s.aliases.is_empty() {
                out.push_str(&format!(" (also {})", s.aliases.join(", ")));
            }
            out.push_str(&format!(" \u{2014} {}", s.description));
        }
        out.push_str("\nAnything else starting with / is sent to the agent as typed.");
        out
    }

    /// `/status`: the same report `iris-gateway status` prints (`StatusReport`), in a chat's words,
    /// with the agent settings (this lane's model) and waiting approvals that only a chat needs.
    fn status_text(&self, hub: &impl CommandsPort, lane: &Lane) -> String {
        let report = hub.status_report();
        let gateway = if report.causes.is_empty() {
            "online".to_owned()
        } else {
            format!("degraded ({})", report.causes.join("; "))
        };
        let up = report.uptime_secs;
        let agent_state = match &report.agent_error {
            Some(e) => format!("not usable: {e}"),
            None => "reachable".to_owned(),
        };
        let settings: AgentSettings = self.choices.turn_settings(lane);
        let storage = match report.store_bytes {
            Some(bytes) => format!(
                "{:.1} MB on disk, {} outbox frames",
                bytes as f64 / 1e6,
                report.cursor_head
            ),
            None => "unreadable".to_owned(),
        };
        let push = match &report.push_error {
            Some(e) => format!("{}, failing: {e}", report.push),
            None => report.push.clone(),
        };
        let open = hub.approvals_waiting();
        let voice = match hub.speech_service() {
            Some(service) => format!(
                "{} (spoken by {service})",
                self.choices.lane_voice(lane).as_str()
            ),
            None => format!(
                "{} (no speech service set)",
                self.choices.lane_voice(lane).as_str()
            ),
        };
        let approvals = match self.agent.approvals_note() {
            Some(note) => format!("\nApprovals: {open} waiting for an answer. {note}"),
            None => String::new(),
        };
        format!(
        "Gateway: {gateway}; up {}h {:02}m; {} device(s) connected.\nAgent: {} \u{2014} {agent_state}.{approvals}\nSettings: reasoning {}, fast {}, model {}, voice {voice}.\nStorage: {storage}.\nPush: {}.",
        up / 3600,
        (up % 3600) / 60,
        report.devices_connected,
        report.agent,
        settings.reasoning.as_deref().unwrap_or("default"),
        if settings.fast { "on" } else { "off" },
        settings.model.as_deref().unwrap_or("default"),
        push,
    )
    }

    /// Adds the backend's caveat, when it cannot apply these choices per message.
    fn with_note(&self, answer: String) -> String {
        match self.agent.choices_note() {
            Some(note) => format!("{answer} {note}"),
            None => answer,
        }
    }
    /// Which call to the agent answering the picker `picker_id` makes, if it is a settings
    /// picker that asks the agent (its models, its jobs): answered beside the reader.
    pub(super) fn agent_call_of(&self, picker_id: &str) -> Option<CallKind> {
        self.choices
            .picker_setting(picker_id)
            .and_then(agent_call_of)
    }

    /// The settings a turn in `lane` runs with (`Choices::turn_settings`).
    pub(super) fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        self.choices.turn_settings(lane)
    }

    pub(super) fn lane_voice(&self, lane: &Lane) -> VoiceMode {
        self.choices.lane_voice(lane)
    }

    pub(super) fn set_lane_voice(&self, lane: &Lane, mode: VoiceMode) {
        self.choices.set_lane_voice(lane, mode);
    }

    /// Forgets the choices of deleted lanes.
    pub(super) fn forget_lanes(&self, gone: &impl Fn(&Lane) -> bool) {
        self.choices.forget_lanes(gone);
    }
}

/// Posts the gateway's answer as a `system` message in `lane`.
pub(super) async fn post_system(port: &impl Port, lane: &Lane, text: String) {
    let message = HistoryMessage::text_only(ids::message_id(), Role::System, text, ids::now_ms());
    let frame = Frame::message(&message).in_lane(&lane.chat_id, lane.thread());
    let changes = vec![
        Change::PutMessage(lane.clone(), message.clone()),
        Change::OutboxOf {
            message_id: message.message_id.clone(),
            frame: frame.outboxed(),
        },
    ];
    if let Err(e) = port.commit(changes, None).await {
        warn!(%lane, "could not post the gateway's answer: {e}");
    }
}

/// Which call to the agent answering a picker of `setting` makes (its models, its jobs), if
/// any: the one place that says which pickers run beside the reader.
fn agent_call_of(setting: Setting) -> Option<CallKind> {
    match setting {
        Setting::Model => Some(CallKind::Models),
        Setting::Job | Setting::JobAction(_) => Some(CallKind::Jobs),
        _ => None,
    }
}

/// A setting's value as a sentence starts.
fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// A model name short enough for a picker label.
fn shorten(s: &str) -> String {
    s.chars().take(40).collect()
}
