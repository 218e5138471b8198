//! The built-in demo agent: deterministic, offline, and exercising every streaming frame.
//!
//! Each turn reasons, plans a todo list, calls one tool (with progress), comments, and streams a
//! reply built from the user's text word by word. It shows a newcomer what a turn looks like
//! and gives the tests and benchmarks an agent whose output they can predict exactly.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::{Agent, AgentError, AgentEvent, LocalBoxFuture, TurnInput, TurnSummary};
use crate::protocol::{MediaRef, Runtime, TodoItem, TodoStatus};

/// The model name the demo reports in footers.
pub const DEMO_MODEL: &str = "iris-demo";

pub struct DemoAgent {
    /// Pause between steps; zero streams as fast as the hub takes events.
    pace: Duration,
}

impl DemoAgent {
    pub fn new(pace_ms: u64) -> DemoAgent {
        DemoAgent {
            pace: Duration::from_millis(pace_ms),
        }
    }
}

/// The demo's answer to `text`: predictable so tests can assert it.
pub fn demo_reply(text: &str) -> String {
    let words = text.split_whitespace().count();
    let chars = text.chars().count();
    let quoted: String = text.chars().take(200).collect();
    format!(
        "You said: \u{201c}{quoted}\u{201d}. That is {words} word{} and {chars} character{}. I am the demo agent; connect a Hermes agent for real answers.",
        if words == 1 { "" } else { "s" },
        if chars == 1 { "" } else { "s" },
    )
}

/// What the demo adds when a message carries files: one line per file, read from disk so the
/// demo proves it received the bytes, not just the metadata.
pub fn describe_media(media: &[(MediaRef, std::path::PathBuf)]) -> String {
    let mut out = String::new();
    for (m, path) in media {
        let on_disk = std::fs::metadata(path).map(|md| md.len()).unwrap_or(0);
        out.push_str(&format!(
            "\nYou attached {} ({}, {}, {} bytes; {} bytes received).",
            m.filename, m.kind, m.mime, m.size, on_disk
        ));
    }
    out
}

fn todos(done: usize) -> Vec<TodoItem> {
    let steps = ["Read the message", "Count its words", "Write the reply"];
    steps
        .iter()
        .enumerate()
        .map(|(i, content)| TodoItem {
            id: format!("t{}", i + 1),
            content: (*content).to_owned(),
            status: match i.cmp(&done) {
                std::cmp::Ordering::Less => TodoStatus::Completed,
                std::cmp::Ordering::Equal => TodoStatus::InProgress,
                std::cmp::Ordering::Greater => TodoStatus::Pending,
            },
        })
        .collect()
}

impl Agent for DemoAgent {
    fn name(&self) -> &'static str {
        "demo"
    }

    /// The demo answers as itself: there is no model to pick.
    fn can_pick_model(&self) -> bool {
        false
    }

    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        Box::pin(async move {
            tracing::debug!(lane = %turn.lane, message = %turn.user_message_id, "demo turn");
            let started = tokio::time::Instant::now();
            let pace = self.pace;
            let send = |ev: AgentEvent| {
                let events = events.clone();
                async move {
                    events
                        .send(ev)
                        .await
                        .map_err(|_| AgentError::Failed("the turn was abandoned".into()))?;
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    Ok::<(), AgentError>(())
                }
            };
            let words = turn.text.split_whitespace().count();
            let chars = turn.text.chars().count();
            send(AgentEvent::Reasoning(format!(
                "The user sent {words} words. I will count them with a tool and echo the message back."
            )))
            .await?;
            send(AgentEvent::Todos(todos(1))).await?;
            let preview: String = turn.text.chars().take(64).collect();
            send(AgentEvent::ToolStart {
                index: 0,
                name: "word_count".into(),
                preview: format!("counting words in \u{201c}{preview}\u{201d}"),
                args: json!({ "text": preview }),
                emoji: Some("\u{1f522}".into()),
            })
            .await?;
            send(AgentEvent::ToolProgress {
                index: 0,
                note: "splitting on whitespace".into(),
            })
            .await?;
            send(AgentEvent::ToolProgress {
                index: 0,
                note: format!("{words} words so far"),
            })
            .await?;
            send(AgentEvent::ToolEnd {
                index: 0,
                ok: true,
                duration_secs: pace.as_secs_f64() * 2.0,
                output_preview: format!("{words} words, {chars} characters"),
            })
            .await?;
            send(AgentEvent::Todos(todos(2))).await?;
            send(AgentEvent::Commentary(
                "Counted; writing the reply now.".into(),
            ))
            .await?;
            let reply = format!("{}{}", demo_reply(&turn.text), describe_media(&turn.media));
            let mut tokens = 0i64;
            for (i, word) in reply.split(' ').enumerate() {
                let chunk = if i == 0 {
                    word.to_owned()
                } else {
                    format!(" {word}")
                };
                send(AgentEvent::Text(chunk)).await?;
                tokens += 1;
            }
            if !turn.media.is_empty() {
                // Answer files with a file: exercises agent-sent media (media.offer) end to end.
                let listing: String = turn
                    .media
                    .iter()
                    .map(|(m, _)| format!("{}\t{}\t{}\n", m.filename, m.mime, m.size))
                    .collect();
                send(AgentEvent::File {
                    filename: "received.txt".into(),
                    mime: "text/plain".into(),
                    kind: "document".into(),
                    bytes: listing.into_bytes(),
                })
                .await?;
            }
            send(AgentEvent::Todos(todos(3))).await?;
            Ok(TurnSummary {
                model: Some(DEMO_MODEL.into()),
                tokens: Some(tokens),
                runtime: Runtime {
                    model: Some(DEMO_MODEL.into()),
                    latency: Some(started.elapsed().as_secs_f64()),
                    ..Runtime::default()
                },
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Lane;

    #[tokio::test(flavor = "current_thread")]
    async fn emits_every_kind_of_event_and_the_predicted_text() {
        let agent = DemoAgent::new(0);
        let (tx, mut rx) = mpsc::channel(64);
        let turn = TurnInput {
            lane: Lane::new("default", None),
            user_message_id: "m1".into(),
            text: "hello there world".into(),
            media: Vec::new(),
            session: "s".into(),
            history: Vec::new(),
            settings: Default::default(),
            resume_run: None,
        };
        let (summary, events) = tokio::join!(agent.run_turn(turn, tx), async {
            let mut v = Vec::new();
            while let Some(e) = rx.recv().await {
                v.push(e);
            }
            v
        });
        let summary = summary.unwrap();
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, demo_reply("hello there world"));
        assert!(text.contains("3 words"));
        for want in [
            "Reasoning",
            "Commentary",
            "ToolStart",
            "ToolProgress",
            "ToolEnd",
            "Todos",
        ] {
            assert!(
                events.iter().any(|e| format!("{e:?}").starts_with(want)),
                "no {want}"
            );
        }
        assert_eq!(summary.model.as_deref(), Some(DEMO_MODEL));
    }
}
