//! What the terminal shows of the gateway's frames, and what it must never let them do to it.

use std::collections::HashSet;
use std::io::Write;

use serde_json::Value;

/// Renders a streamed turn in a plain terminal: text grows in place by printing only what
/// was appended since the last update; tool and todo lines interleave on their own lines.
#[derive(Default)]
pub(super) struct Screen {
    /// The reply text shown so far for the message being streamed.
    printed: String,
    streaming: bool,
    /// The cursor sits after streamed text (not at the start of a line).
    mid_line: bool,
    /// Lines about files, held while an answer streams so they do not split its text.
    pub(super) held: Vec<String>,
}

impl Screen {
    /// A line of its own, after ending a streamed line that is still open.
    pub(super) fn line(&mut self, s: &str) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
        println!("{s}");
    }

    /// A line that can wait for the answer streaming now to finish.
    pub(super) fn note(&mut self, s: String) {
        if self.streaming {
            self.held.push(s);
        } else {
            self.line(&s);
        }
    }

    /// The connection dropped mid-answer: the line is closed, and the answer starts over whole
    /// when it streams again (or arrives complete with the reconnect's replay).
    pub(super) fn interrupted(&mut self) {
        if self.streaming {
            self.line("  \x1b[2m[answer interrupted]\x1b[0m");
        }
        self.streaming = false;
        self.printed.clear();
        for held in std::mem::take(&mut self.held) {
            self.line(&held);
        }
    }

    /// The streamed answer grew: print only what is new.
    fn update(&mut self, text: &str) {
        if !self.streaming {
            self.line("");
            print!("\x1b[1magent:\x1b[0m ");
            self.streaming = true;
            self.mid_line = true;
        }
        let delta = match text.strip_prefix(self.printed.as_str()) {
            Some(rest) => rest.to_owned(),
            None => format!("\n{text}"),
        };
        if !delta.is_empty() {
            print!("{delta}");
            self.mid_line = true;
        }
        self.printed = text.to_owned();
        let _ = std::io::stdout().flush();
    }

    /// The answer is complete: its footer (model, tokens, time).
    fn stop(&mut self, frame: &Value) {
        let p = &frame["payload"];
        self.update(p["final_text"].as_str().unwrap_or(""));
        if let Some(r) = p["reasoning"].as_str() {
            self.line(&format!("  \x1b[2mreasoning: {r}\x1b[0m"));
        }
        let model = p["model"].as_str().unwrap_or("?");
        let tokens = p["tokens"].as_i64().unwrap_or(0);
        let latency = p["runtime"]["latency"].as_f64().unwrap_or(0.0);
        self.line(&format!(
            "  \x1b[2m[{model} \u{b7} {tokens} tokens \u{b7} {latency:.1}s]\x1b[0m"
        ));
        self.streaming = false;
        self.printed.clear();
        for held in std::mem::take(&mut self.held) {
            self.line(&held);
        }
    }
}

/// Whether a frame belongs to the lane the terminal shows (this channel, not a thread).
pub(super) fn in_lane(frame: &Value, chat_id: &str) -> bool {
    frame["chat_id"].as_str() == Some(chat_id) && frame.get("thread_id").is_none()
}

/// What this connection's `message.update` frames leave for the client to remember
/// (`update_append`, docs/protocol.md): a continuation carries no lane, and no message id while
/// it continues the message of the connection's previous update.
#[derive(Default)]
pub(super) struct Updates {
    /// The message of the previous `message.update` on this connection.
    last: Option<String>,
    /// Messages streaming in the lane shown, learnt from their first update (which has its
    /// lane); forgotten at their `message.stop`.
    shown: HashSet<String>,
}

impl Updates {
    /// Whether a `message.update` is for the lane shown; notes its message as the last.
    fn shown(&mut self, frame: &Value, chat_id: &str) -> bool {
        let id = match (frame["payload"]["message_id"].as_str(), &self.last) {
            (Some(id), _) => id.to_owned(),
            (None, Some(last)) => last.clone(),
            // A gateway that breaks the rule: nothing to attribute the text to.
            (None, None) => return false,
        };
        let shown = if frame.get("chat_id").is_some() {
            let shown = in_lane(frame, chat_id);
            if shown {
                self.shown.insert(id.clone());
            } else {
                self.shown.remove(&id);
            }
            shown
        } else {
            self.shown.contains(&id)
        };
        self.last = Some(id);
        shown
    }

    fn stopped(&mut self, frame: &Value) {
        if let Some(id) = frame["payload"]["message_id"].as_str() {
            self.shown.remove(id);
        }
    }
}

/// What the gateway relays (an agent's words, tool names and previews, channel names) must not
/// drive the terminal: control characters other than newline and tab (escape sequences can
/// rewrite the screen, the window title or the clipboard) are shown as U+FFFD.
pub(super) fn printable(v: Value) -> Value {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    match v {
        Value::String(s) if s.chars().any(bad) => Value::String(
            s.chars()
                .map(|c| if bad(c) { '\u{fffd}' } else { c })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(printable).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, printable(v))).collect()),
        v => v,
    }
}

/// A complete message as one line. This client's own messages are not passed here (the
/// terminal already shows what was typed), so a user message came from another device.
/// A voice note being transcribed is a state, not words of the agent's.
fn message_line(p: &Value) -> String {
    let text = p["text"].as_str().unwrap_or("");
    let files = attached(&p["media"]);
    let transcribing = p["message_id"]
        .as_str()
        .is_some_and(|id| id.ends_with(".hearing"));
    match p["role"].as_str().unwrap_or("") {
        "system" if transcribing => "[transcribing the voice note\u{2026}]".to_owned(),
        "user" => format!("\x1b[1myou (another device):\x1b[0m {text}{files}"),
        role => format!("\x1b[1m{role}:\x1b[0m {text}{files}"),
    }
}

/// The names of a message's files, as ` [file: NAME]` after its text.
fn attached(media: &Value) -> String {
    media
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| format!(" [file: {}]", m["filename"].as_str().unwrap_or("?")))
        .collect()
}

/// A `history` page, oldest first: the lane's recent messages, shown when it is opened.
pub(super) fn render_history(screen: &mut Screen, payload: &Value) {
    let mut messages: Vec<&Value> = payload["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    messages.sort_by_key(|m| m["ts"].as_i64().unwrap_or(0));
    if messages.is_empty() {
        screen.line("[no messages here yet]");
        return;
    }
    let older = if payload["has_more"] == true {
        " (older ones not shown)"
    } else {
        ""
    };
    screen.line(&format!(
        "[the last {} messages here{older}]",
        messages.len()
    ));
    for m in messages {
        let who = if m["role"] == "user" { "you" } else { "agent" };
        let files = attached(&m["media"]);
        screen.line(&format!(
            "\x1b[2m{who}:\x1b[0m {}{files}",
            m["text"].as_str().unwrap_or("")
        ));
    }
    screen.line("[end of history]");
}

/// The streamed text after a `message.update`: the whole text, or (`update_append`) the first
/// `append_at` characters of what the screen has, followed by the update's text.
fn updated_text(printed: &str, payload: &Value) -> String {
    let text = payload["text"].as_str().unwrap_or("");
    match payload["append_at"].as_u64() {
        Some(at) => {
            let mut kept: String = printed
                .chars()
                .take(usize::try_from(at).unwrap_or(usize::MAX))
                .collect();
            kept.push_str(text);
            kept
        }
        None => text.to_owned(),
    }
}

/// One frame from the gateway, as the terminal shows it: status and errors always, a turn only
/// when it is in this channel (not a thread).
pub(super) fn render(screen: &mut Screen, updates: &mut Updates, frame: &Value, chat_id: &str) {
    let p = &frame["payload"];
    let kind = frame["type"].as_str().unwrap_or("");
    let shown = match kind {
        "message.update" => updates.shown(frame, chat_id),
        "message.stop" => {
            updates.stopped(frame);
            in_lane(frame, chat_id)
        }
        _ => in_lane(frame, chat_id),
    };
    match kind {
        "status" => screen.line(&format!("[gateway {}]", p["state"].as_str().unwrap_or("?"))),
        "channel.list" => {
            for c in p["channels"].as_array().into_iter().flatten() {
                let here = if c["chat_id"] == chat_id { "*" } else { " " };
                let default = if c["is_default"] == true {
                    " (default)"
                } else {
                    ""
                };
                screen.line(&format!(
                    "  {here} {} [{}]{default}",
                    c["name"].as_str().unwrap_or(""),
                    c["kind"].as_str().unwrap_or("")
                ));
            }
        }
        "error" => screen.line(&format!(
            "\x1b[31merror ({}): {}\x1b[0m",
            p["code"].as_str().unwrap_or("?"),
            p["message"].as_str().unwrap_or("")
        )),
        _ if !shown => {}
        "message.update" => {
            let text = updated_text(&screen.printed, p);
            screen.update(&text);
        }
        "message.stop" => screen.stop(frame),
        "typing" if p["on"] == true && !screen.streaming => {
            screen.line("[agent is typing\u{2026}]")
        }
        "message" => screen.line(&message_line(p)),
        "commentary" => screen.line(&format!("  \u{1f4ac} {}", p["text"].as_str().unwrap_or(""))),
        "tool.start" => screen.line(&format!(
            "  {} {}: {}",
            p["emoji"].as_str().unwrap_or("\u{1f527}"),
            p["name"].as_str().unwrap_or(""),
            p["preview"].as_str().unwrap_or("")
        )),
        "tool.progress" => screen.line(&format!(
            "    \u{2026} {}",
            p["note"].as_str().unwrap_or("")
        )),
        "tool.end" => screen.line(&format!(
            "    {} {} ({:.2}s)",
            if p["ok"] == true {
                "\u{2713}"
            } else {
                "\u{2717}"
            },
            p["output_preview"].as_str().unwrap_or(""),
            p["duration"].as_f64().unwrap_or(0.0)
        )),
        "todo.update" => {
            let items: Vec<String> = p["todos"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|t| {
                            let mark = match t["status"].as_str() {
                                Some("completed") => "\u{2611}",
                                Some("in_progress") => "\u{25d0}",
                                Some("cancelled") => "\u{2612}",
                                _ => "\u{2610}",
                            };
                            format!("{mark} {}", t["content"].as_str().unwrap_or(""))
                        })
                        .collect()
                })
                .unwrap_or_default();
            screen.line(&format!("  \x1b[2mtodo: {}\x1b[0m", items.join("  ")));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn append_updates_reassemble_and_whole_ones_replace() {
        let mut text = updated_text("", &json!({"text": "héllo", "append_at": 0}));
        text = updated_text(&text, &json!({"text": " wörld", "append_at": 5}));
        assert_eq!(text, "héllo wörld");
        text = updated_text(&text, &json!({"text": "héllo", "append_at": 0}));
        assert_eq!(text, "héllo");
        text = updated_text(&text, &json!({"text": "whole"}));
        assert_eq!(text, "whole");
    }

    #[test]
    fn continuations_belong_to_the_last_updates_message_and_its_lane() {
        let mut u = Updates::default();
        let update = |chat: Option<&str>, id: Option<&str>| {
            let mut f = json!({"type": "message.update", "payload": {"text": "t", "append_at": 1}});
            if let Some(c) = chat {
                f["chat_id"] = json!(c);
            }
            if let Some(m) = id {
                f["payload"]["message_id"] = json!(m);
            }
            f
        };
        assert!(
            !u.shown(&update(None, None), "default"),
            "nothing to continue"
        );
        assert!(u.shown(&update(Some("default"), Some("msg_a")), "default"));
        assert!(u.shown(&update(None, None), "default"));
        // Another lane's answer streams in between: not shown, nor its continuations.
        assert!(!u.shown(&update(Some("other"), Some("msg_b")), "default"));
        assert!(!u.shown(&update(None, None), "default"));
        // Back to the shown one, named since another message's update came between.
        assert!(u.shown(&update(None, Some("msg_a")), "default"));
        assert!(u.shown(&update(None, None), "default"));
        u.stopped(&json!({"payload": {"message_id": "msg_a"}}));
        assert!(u.shown.is_empty());
    }

    #[test]
    fn relayed_text_cannot_send_terminal_escapes() {
        let frame = json!({"payload": {"text": "hi\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J\nok\tthere",
                                      "todos": [{"content": "\u{1b}[31mred"}]}});
        let clean = printable(frame);
        let text = clean["payload"]["text"].as_str().unwrap();
        assert_eq!(
            text,
            "hi\u{fffd}]52;c;ZXZpbA==\u{fffd}\u{fffd}2J\nok\tthere"
        );
        assert_eq!(clean["payload"]["todos"][0]["content"], "\u{fffd}[31mred");
    }
}
