//! Agent text through the outgoing budget (`protocol::fit`) and the frame encoder.
//!
//! The first two input bytes pick `limits.max_out_frame_bytes` (64 to 128 KiB, so short inputs
//! reach the cuts); the rest is split at 0xFF bytes into streamed pieces, each (lossily) UTF-8,
//! whose first byte says reply text, reasoning or commentary. Checked: every `message.update`
//! the stream produces, the final `message.stop`, its history entry and every `commentary`
//! encode within the limit whatever the escaping; a reply cut ends with its note; nothing of
//! a piece is lost before the cut (the kept text is a prefix of what was sent); and the
//! writer's last-resort cut brings the frame under a much smaller limit still as valid JSON.

#![no_main]

use iris_gateway::protocol::fit::{self, OutBudget};
use iris_gateway::protocol::{Frame, HistoryMessage, Role};
use libfuzzer_sys::fuzz_target;

const NOTE: &str = "\n\n[reply cut]";

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let max_out = (64 << 10) + usize::from(u16::from_le_bytes([data[0], data[1]]));
    let budget = OutBudget::new(max_out);
    let (mut text, mut text_escaped, mut cut) = (String::new(), 0usize, false);
    let (mut reasoning, mut reasoning_escaped) = (String::new(), 0usize);
    let mut sent = String::new();
    for piece in data[2..].split(|b| *b == 0xff) {
        let Some((&kind, rest)) = piece.split_first() else {
            continue;
        };
        let delta = String::from_utf8_lossy(rest);
        match kind % 3 {
            0 if !cut => {
                sent.push_str(&delta);
                cut = fit::push_within(&mut text, &mut text_escaped, &delta, budget.text, NOTE);
                assert_eq!(text_escaped, fit::escaped_len(&text));
                assert!(text_escaped <= budget.text);
                let update = Frame::message_update("msg_1", &text).encode();
                assert!(
                    update.len() <= max_out,
                    "update {} > {max_out}",
                    update.len()
                );
            }
            1 => {
                fit::push_within(
                    &mut reasoning,
                    &mut reasoning_escaped,
                    &delta,
                    budget.reasoning,
                    "",
                );
                assert!(reasoning_escaped <= budget.reasoning);
            }
            2 => {
                let mut said = delta.into_owned();
                fit::cut_in_place(&mut said, budget.text);
                let f = Frame::commentary("msg_1", &said).encode();
                assert!(f.len() <= max_out);
            }
            _ => {}
        }
    }
    let kept = text.strip_suffix(NOTE).filter(|_| cut).unwrap_or(&text);
    assert!(sent.starts_with(kept), "the kept text is not what was sent");
    let mut m = HistoryMessage {
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        model: Some("mock-model".into()),
        tokens: Some(1),
        ..HistoryMessage::text_only("msg_1".into(), Role::Assistant, text, 1)
    };
    assert!(
        !fit::fit_message(&mut m, &budget),
        "streamed text needed no second cut"
    );
    let stop = Frame::message_stop(&m)
        .in_lane("default", Some("thr_1"))
        .encode();
    assert!(
        stop.len() <= max_out,
        "message.stop {} > {max_out}",
        stop.len()
    );
    let replay = iris_gateway::protocol::with_cursor(&stop, u64::MAX);
    assert!(replay.len() <= max_out);
    let page = Frame::history(Some(1), std::slice::from_ref(&m), false, None).encode();
    assert!(page.len() <= max_out);
    // The writer's safety net, at a limit far below what the producer aimed for.
    let small = 4096;
    let shrunk = fit::shrink_encoded(&stop, small).expect("message.stop can always be cut");
    assert!(shrunk.len() <= small);
    serde_json::from_slice::<serde_json::Value>(&shrunk).expect("still JSON");
});
