//! The text-frame decoder (`protocol::decode_request`) on any input a socket can deliver.
//!
//! tungstenite hands the reader only valid UTF-8 text frames, so other bytes are skipped here.
//! Checked for every input: no panic; memory within a linear bound of the frame's size; the
//! scope ids of an accepted frame are valid ids; a refusal always says something, and what it
//! says is bounded by the frame; and an accepted frame decodes to the same request after a
//! round trip through `serde_json::Value` (the no-alloc header path and the full-parser path
//! agree, whatever escapes and spacing the app used).

#![no_main]

use iris_gateway::protocol::{decode_request, is_valid_id};
use iris_gateway_fuzz::{check_alloc, measure, Counting};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak bytes per input byte the decoder may hold, plus a fixed allowance. The costliest input
/// the typed payloads allow is a list of empty strings (`"message_ids":["","",…]`): 24 bytes of
/// `String` per 3 bytes of frame, and up to 3× that while the `Vec` doubles (old and new buffer
/// are both counted). The limits on such lists (`max_delete_ids`, `max_media_per_message`) are
/// checked after decoding. Anything costlier per byte, or growing faster than the input, fails.
const PER_BYTE: usize = 24;
const FIXED: usize = 8 << 10;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (result, peak) = measure(|| decode_request(text));
    check_alloc("decode_request", text.len(), peak, PER_BYTE, FIXED);
    match result {
        Ok(frame) => {
            for id in [&frame.chat_id, &frame.thread_id].into_iter().flatten() {
                assert!(
                    is_valid_id(id),
                    "accepted a scope id that is not valid: {id:?}"
                );
            }
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                panic!("accepted a frame that is not JSON ({e})");
            }
            // `Value` refuses what JSON's grammar allows but f64 or UTF-8 cannot hold (1e400, a
            // lone surrogate escape); the gateway may skip those in fields it ignores.
            let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
                return;
            };
            // `Value` also reads the integer literal `-0` as the float -0.0 (to keep its sign)
            // and writes it back as `-0.0`, which an integer field rightly refuses; the gateway
            // reads `-0` as 0, as JSON's grammar has it.
            if has_negative_zero(&value) {
                return;
            }
            let again = decode_request(&value.to_string());
            assert_eq!(
                again.as_ref().ok(),
                Some(&frame),
                "the same frame re-encoded decodes differently: {again:?}"
            );
        }
        Err(e) => {
            assert!(!e.message.is_empty(), "a refusal without a message");
            assert!(
                e.message.len() <= text.len() + 1024,
                "a refusal message of {} bytes for a {}-byte frame",
                e.message.len(),
                text.len()
            );
        }
    }
});

fn has_negative_zero(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Number(n) => {
            n.as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative())
                && !n.is_i64()
                && !n.is_u64()
        }
        serde_json::Value::Array(items) => items.iter().any(has_negative_zero),
        serde_json::Value::Object(map) => map.values().any(has_negative_zero),
        _ => false,
    }
}
