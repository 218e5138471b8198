//! The gateway's own commands as text: the one table that feeds `commands.catalog`, `/help`
//! and parsing. Plain data, imported by the hub's port (a command handed to the commands).

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
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) aliases: &'static [&'static str],
    pub(super) args_hint: &'static str,
    pub(super) category: &'static str,
    pub(super) description: &'static str,
    /// Only listed when the agent offers a model choice.
    pub(super) needs_models: bool,
}

pub(super) const SPECS: &[Spec] = &[
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
