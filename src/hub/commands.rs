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

use std::rc::Rc;

use serde_json::{json, Value};
use tracing::warn;

use super::choices::{Picker, Setting};
use super::errors::Refusal;
use super::jobs::JobsOffer;
use super::state::{gateway_message, Hub};
use crate::agent::AgentSettings;
use crate::ids;
use crate::outlet::Outlet;
use crate::protocol::{Frame, Lane, Role};
use crate::store::{Change, LaneModel, Record};

/// The reasoning efforts offered (`default` leaves the agent's own setting).
const REASONING_LEVELS: [&str; 5] = ["default", "none", "low", "medium", "high"];

/// A command the gateway answers itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    New,
    Stop,
    Help,
    Status,
    Reasoning(Option<String>),
    Fast(Option<String>),
    Model(Option<String>),
    /// `/jobs`: the agent's scheduled jobs, as a picker (`jobs.rs`).
    Jobs,
    /// `/steer TEXT`: guidance for the running answer (`steer.rs`), never answered here.
    Steer(Option<String>),
    /// `/voice on|off|auto`: whether this lane's answers are also spoken (`voice_reply.rs`).
    Voice(Option<String>),
}

/// One catalog entry: the single source for `commands.catalog`, `/help` and parsing.
struct Spec {
    name: &'static str,
    aliases: &'static [&'static str],
    args_hint: &'static str,
    category: &'static str,
    description: &'static str,
    /// Only listed when the agent offers a model choice.
    needs_models: bool,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "/new",
        aliases: &["/reset"],
        args_hint: "",
        category: "Session",
        description:
            "Start a fresh conversation in this chat (the agent forgets the earlier messages)",
        needs_models: false,
    },
    Spec {
        name: "/stop",
        aliases: &[],
        args_hint: "",
        category: "Session",
        description: "Stop the agent's answer that is running in this chat (apps can also send the frame agent.stop)",
        needs_models: false,
    },
    Spec {
        name: "/steer",
        aliases: &[],
        args_hint: "TEXT",
        category: "Session",
        description: "Guide the answer that is running in this chat without stopping it (apps can also send the frame agent.steer); with nothing to take it, TEXT is sent as the next message",
        needs_models: false,
    },
    Spec {
        name: "/reasoning",
        aliases: &[],
        args_hint: "[default|none|low|medium|high]",
        category: "Configuration",
        description: "How hard the model thinks before answering",
        needs_models: false,
    },
    Spec {
        name: "/fast",
        aliases: &[],
        args_hint: "[on|off]",
        category: "Configuration",
        description: "Ask the provider for its fast (priority) tier",
        needs_models: false,
    },
    Spec {
        name: "/model",
        aliases: &[],
        args_hint: "[name]",
        category: "Configuration",
        description: "Choose the model the agent uses",
        needs_models: true,
    },
    Spec {
        name: "/voice",
        aliases: &[],
        args_hint: "[on|off|auto]",
        category: "Configuration",
        description: "Whether the agent's answers in this chat are also spoken (auto: answers to voice notes); needs a speech service on the gateway",
        needs_models: false,
    },
    Spec {
        name: "/jobs",
        aliases: &[],
        args_hint: "",
        category: "Tools & Skills",
        description: "The agent's scheduled jobs (schedule, next run, last result): pause, resume, run now or remove one; their results arrive in the chat they were asked for",
        needs_models: false,
    },
    Spec {
        name: "/status",
        aliases: &[],
        args_hint: "",
        category: "Info",
        description: "Gateway, agent, storage and push health",
        needs_models: false,
    },
    Spec {
        name: "/help",
        aliases: &[],
        args_hint: "",
        category: "Info",
        description: "What the commands do; other /commands go to the agent as typed",
        needs_models: false,
    },
];

/// The command in `text`, if it starts with one the gateway knows.
pub fn parse(text: &str) -> Option<Command> {
    let text = text.trim();
    let rest = text.strip_prefix('/')?;
    let (word, arg) = match rest.split_once(char::is_whitespace) {
        Some((w, a)) => (w, a.trim()),
        None => (rest, ""),
    };
    let name = format!("/{}", word.to_ascii_lowercase());
    let spec = SPECS
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name.as_str()))?;
    let arg = (!arg.is_empty()).then(|| arg.to_owned());
    Some(match spec.name {
        "/new" => Command::New,
        "/stop" => Command::Stop,
        "/help" => Command::Help,
        "/status" => Command::Status,
        "/reasoning" => Command::Reasoning(arg.map(|a| a.to_ascii_lowercase())),
        "/fast" => Command::Fast(arg.map(|a| a.to_ascii_lowercase())),
        "/steer" => Command::Steer(arg),
        "/jobs" => Command::Jobs,
        "/voice" => Command::Voice(arg),
        _ => Command::Model(arg),
    })
}

impl Hub {
    /// The catalog for the app's `/` drawer.
    pub fn commands_catalog(&self) -> Value {
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
    pub async fn execute_command(self: &Rc<Self>, lane: &Lane, command: Command) {
        let answer = match command {
            Command::New => {
                self.turns.new_lane_session(lane, ids::now_ms()).await;
                self.turns.clear_todos(lane);
                // No turn ends to store it: a fresh conversation's empty plan is stored now.
                if let Some(todos) = self.turns.unsaved_todos(lane) {
                    let put = Change::Record(Record::PutTodos(lane.clone(), todos));
                    if let Err(e) = self.commit(vec![put], None).await {
                        warn!(%lane, "could not store the cleared todo list: {e}");
                    }
                }
                "Started a new conversation: the agent will not see the earlier messages of this chat."
                .to_owned()
            }
            Command::Stop => {
                if self.turns.stop(lane) {
                    "Stopped the agent's answer.".to_owned()
                } else {
                    "Nothing is running in this chat.".to_owned()
                }
            }
            Command::Help => self.help_text(),
            Command::Status => self.status_text(lane),
            Command::Reasoning(None) => return self.open_picker(lane, Setting::Reasoning).await,
            Command::Fast(None) => return self.open_picker(lane, Setting::Fast).await,
            Command::Model(None) => return self.open_picker(lane, Setting::Model).await,
            Command::Jobs => return self.offer(lane, self.jobs.picker(lane).await).await,
            Command::Reasoning(Some(v)) => self.apply_setting(lane, Setting::Reasoning, &v).await,
            Command::Fast(Some(v)) => self.apply_setting(lane, Setting::Fast, &v).await,
            Command::Model(Some(v)) => self.apply_setting(lane, Setting::Model, &v).await,
            // `/steer TEXT` never gets here (`send_message` hands it to `steer`).
            Command::Voice(Some(v)) => self.turns.set_voice_mode(lane, &v).await,
            Command::Voice(None) => format!(
                "Voice in this chat: {}. Say `/voice on`, `/voice off` or `/voice auto` (answers to voice notes).",
                self.turns.voice_mode(lane).as_str()
            ),
            Command::Steer(_) => {
                "Say `/steer` and the guidance, e.g. `/steer keep it short`: the running answer takes it without stopping.".to_owned()
            }
        };
        self.post_system(lane, answer).await;
    }

    /// Answers a picker. Unknown or expired ids are a no-op, as the schema says.
    pub async fn picker_select(
        self: &Rc<Self>,
        _outlet: &Rc<Outlet>,
        picker_id: &str,
        value: &str,
    ) -> Result<(), Refusal> {
        let picker = self.choices.take_picker(picker_id);
        if let Some(p) = picker {
            if self.lane_exists(&p.lane) {
                let answer = match p.setting {
                    Setting::Job => {
                        let offer = self.jobs.actions_picker(value).await;
                        self.offer(&p.lane, offer).await;
                        return Ok(());
                    }
                    Setting::JobAction(job_id) => self.jobs.apply_action(&job_id, value).await,
                    setting => self.apply_setting(&p.lane, setting, value).await,
                };
                self.post_system(&p.lane, answer).await;
            }
        }
        Ok(())
    }

    /// Changes one setting from a command argument or a picker value; returns what to tell the
    /// user. Reasoning and speed apply to every lane; a model to `lane` only.
    async fn apply_setting(&self, lane: &Lane, setting: Setting, value: &str) -> String {
        let value = value.trim();
        if setting == Setting::Model {
            return self.choose_lane_model(lane, value).await;
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
        if let Err(e) = self.choices.store_settings(self, settings).await {
            warn!("could not store the agent settings: {e}");
            return format!("Could not save the setting: {e}.");
        }
        answer
    }

    /// `/model NAME` (or a picker's value) in `lane`: the lane's next turns ask for that model;
    /// `default` goes back to the agent's own.
    async fn choose_lane_model(&self, lane: &Lane, value: &str) -> String {
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
            .store_lane_model(self, lane, choice.clone())
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
            if let Err(e) = self.choices.store_settings(self, settings).await {
                warn!("could not store the agent settings: {e}");
                return format!("Could not save the setting: {e}.");
            }
        }
        answer
    }

    /// Offers a setting's choices as an outboxed `picker.choice` in `lane`.
    async fn open_picker(self: &Rc<Self>, lane: &Lane, setting: Setting) {
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
                        return self.post_system(lane, text).await;
                    }
                    Err(e) => {
                        let text = format!("Could not ask the agent for its models: {e}.");
                        return self.post_system(lane, text).await;
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
            Setting::Job | Setting::JobAction(_) => {
                return self.offer(lane, self.jobs.picker(lane).await).await
            }
        };
        let choices: Vec<Value> = choices
        .into_iter()
        .map(|(value, label, is_current)| {
            json!({ "value": value, "label": label, "is_current": is_current })
        })
        .collect();
        self.offer_picker(lane, title, choices, setting).await;
    }

    /// Sends a picker in `lane` and remembers what answering it means.
    pub(super) async fn offer_picker(
        &self,
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
        if let Err(e) = self
            .commit(vec![Change::Outbox(frame.outboxed())], None)
            .await
        {
            warn!(%lane, "could not send a picker: {e}");
        }
    }

    /// Says or offers what the agent's jobs answer in `lane`.
    async fn offer(&self, lane: &Lane, offer: JobsOffer) {
        match offer {
            JobsOffer::Say(text) => self.post_system(lane, text).await,
            JobsOffer::Pick {
                title,
                choices,
                setting,
            } => self.offer_picker(lane, &title, choices, setting).await,
        }
    }

    /// Posts the gateway's answer as a `system` message in `lane`.
    pub(super) async fn post_system(&self, lane: &Lane, text: String) {
        let message = gateway_message(Role::System, text);
        let frame = Frame::message(&message).in_lane(&lane.chat_id, lane.thread());
        let changes = vec![
            Change::PutMessage(lane.clone(), message.clone()),
            Change::OutboxOf {
                message_id: message.message_id.clone(),
                frame: frame.outboxed(),
            },
        ];
        if let Err(e) = self.commit(changes, None).await {
            warn!(%lane, "could not post the gateway's answer: {e}");
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
    fn status_text(&self, lane: &Lane) -> String {
        let report = self.status.report();
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
        let settings: AgentSettings = self.turn_settings(lane);
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
        let open = self.open_approvals.count();
        let voice = match self.speech_service() {
            Some(service) => format!(
                "{} (spoken by {service})",
                self.turns.voice_mode(lane).as_str()
            ),
            None => format!(
                "{} (no speech service set)",
                self.turns.voice_mode(lane).as_str()
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

impl Hub {
    /// The settings a turn in `lane` runs with (`Choices::turn_settings`).
    pub(super) fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        self.choices.turn_settings(lane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_commands_parse_and_others_pass_through() {
        assert_eq!(parse("/new"), Some(Command::New));
        assert_eq!(parse("  /RESET  "), Some(Command::New));
        assert_eq!(
            parse("/reasoning high"),
            Some(Command::Reasoning(Some("high".into())))
        );
        assert_eq!(parse("/fast"), Some(Command::Fast(None)));
        assert_eq!(
            parse("/model mock-large"),
            Some(Command::Model(Some("mock-large".into())))
        );
        assert_eq!(parse("/skills list"), None);
        assert_eq!(parse("hello /new"), None);
        assert_eq!(parse("/"), None);
        assert_eq!(parse("/newer"), None);
    }
}
