use super::run::tool_emoji;
use super::transcript::{
    call_ids_named, find_tool_call, todos_from_result, without_image_placeholders,
};
use super::wire::Message;
use super::*;
use crate::agent::media_in::AgentInput;
use crate::agent::RunState;
use crate::protocol::TodoStatus;
use serde_json::Value;

/// Transcript rows as Hermes' API gives them, read as the backend reads them.
fn rows(json: &[Value]) -> Vec<Message> {
    json.iter().map(record).collect()
}

#[test]
fn a_tool_call_is_found_with_its_arguments_and_result() {
    let messages = vec![
        json!({"role": "user", "content": "plan tea"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "todo", "arguments": "{\"todos\":[{\"id\":\"1\",\"content\":\"Boil\",\"status\":\"pending\"}]}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"todos\":[{\"id\":\"1\",\"content\":\"Boil\",\"status\":\"in_progress\"}]}"}),
    ];
    let messages = rows(&messages);
    let (args, output) = find_tool_call(&messages, "call_1").unwrap();
    assert_eq!(args["todos"][0]["content"], "Boil");
    let todos = todos_from_result(&output).unwrap();
    assert_eq!(todos.len(), 1);
    assert_eq!(todos[0].status, TodoStatus::InProgress);
    assert!(find_tool_call(&messages, "call_2").is_none());
}

#[test]
fn a_run_waits_only_while_its_approval_is_the_last_event() {
    let waiting = json!({"status": "waiting_for_approval", "last_event": "approval.request"});
    assert_eq!(run_state_of(&waiting), RunState::Active { waiting: true });
    // Hermes' timeout leaves the status as it was; the next event moves on.
    let gave_up = json!({"status": "waiting_for_approval", "last_event": "tool.completed"});
    assert_eq!(run_state_of(&gave_up), RunState::Active { waiting: false });
    let done = json!({"status": "completed", "output": "ok", "usage": {"total_tokens": 7}});
    assert_eq!(
        run_state_of(&done),
        RunState::Completed {
            output: "ok".into(),
            tokens: Some(7)
        }
    );
    assert_eq!(
        run_state_of(&json!({"status": "cancelled"})),
        RunState::Cancelled
    );
    assert_eq!(
        run_state_of(&json!({"status": "failed"})),
        RunState::Failed("the run failed".into())
    );
}

#[test]
fn a_completed_tool_is_matched_to_the_first_unreported_call_of_its_name() {
    let turn = vec![
        json!({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "terminal", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "a", "content": "one"}),
        json!({"role": "assistant", "tool_calls": [{"id": "b", "function": {"name": "terminal", "arguments": "{}"}}]}),
    ];
    let turn = rows(&turn);
    assert_eq!(call_ids_named(&turn, "terminal"), ["a", "b"]);
    assert!(call_ids_named(&turn, "todo").is_empty());
    assert_eq!(tool_emoji("terminal"), Some("\u{1f4bb}"));
}

#[test]
fn recovery_reads_the_transcript() {
    let q = json!({"role": "user", "content": "hi"});
    let a = json!({"role": "assistant", "content": "hello", "finish_reason": "stop"});
    let cut = json!({"role": "assistant", "content": "hel", "finish_reason": null});
    assert_eq!(
        recovery_from(&rows(&[q.clone(), a]), "hi"),
        Recovery::Answered("hello".into())
    );
    assert_eq!(
        recovery_from(&rows(&[q.clone(), cut]), "hi"),
        Recovery::Partial("hel".into())
    );
    assert_eq!(
        recovery_from(&rows(std::slice::from_ref(&q)), "hi"),
        Recovery::Unknown
    );
    assert_eq!(recovery_from(&rows(&[q]), "other"), Recovery::Unknown);
}

#[test]
fn a_message_sent_with_images_is_found_by_its_text() {
    let q = json!({"role": "user", "content": [
        {"type": "text", "text": "what plant?\n[image: p.png]"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,\u{2026}"}}]});
    let a = json!({"role": "assistant", "content": "a fern", "finish_reason": "stop"});
    assert_eq!(
        recovery_from(&rows(&[q.clone(), a.clone()]), "what plant?"),
        Recovery::Answered("a fern".into())
    );
    assert_eq!(
        recovery_from(&rows(&[q.clone(), a.clone()]), "what"),
        Recovery::Unknown
    );
    assert_eq!(
        rows(&[q])[0].content.words().unwrap(),
        "what plant?\n[image: p.png]"
    );
    let files_only =
        json!({"role": "user", "content": "\n[attached: v.ogg (audio/ogg, 4 bytes): not read]"});
    assert_eq!(
        recovery_from(&rows(&[files_only, a]), ""),
        Recovery::Answered("a fern".into())
    );
}

#[test]
fn hermes_image_placeholders_leave_the_history() {
    assert_eq!(
        without_image_placeholders("see\n[image: p.png]\n[screenshot]"),
        "see\n[image: p.png]"
    );
    assert_eq!(without_image_placeholders("[screenshot]"), "[screenshot]");
    let stored = json!({"role": "user", "content": "what plant?\n[image: p.png]\n[screenshot]"});
    let a = json!({"role": "assistant", "content": "a fern", "finish_reason": "stop"});
    assert_eq!(
        recovery_from(&rows(&[stored, a]), "what plant?"),
        Recovery::Answered("a fern".into())
    );
}

#[test]
fn runs_input_is_text_without_images_and_parts_with_them() {
    let mut input = AgentInput {
        text: "hi".into(),
        images: Vec::new(),
    };
    assert_eq!(runs_input(&input), json!("hi"));
    input.images.push(media_in::AgentImage {
        filename: "p.png".into(),
        mime: "image/png",
        bytes: vec![1, 2, 3],
        width: 1,
        height: 1,
    });
    assert_eq!(
        runs_input(&input),
        json!([{"role": "user", "content": [
            {"type": "text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AQID"}}]}])
    );
}
