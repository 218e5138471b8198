//! The webhook body parser (`hub::parse_webhook_body`) on any body and content type.
//!
//! The first input byte picks the `Content-Type` header (or none; or, for values past the
//! table, the bytes up to the first newline); the rest is the body. Checked: no panic; memory
//! within a linear bound of the body; a refusal is always 400 with a bounded message; a text
//! body is taken exactly as sent; an accepted JSON body says the same as `serde_json::Value`
//! reads from it (a string `text`, an optional string `title`), and text and title are never
//! longer than the body they came from.

#![no_main]

use iris_gateway::hub::HookError;
use iris_gateway::hub::parse_webhook_body;
use iris_gateway_fuzz::{check_alloc, measure, Counting};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[global_allocator]
static ALLOC: Counting = Counting;

const PER_BYTE: usize = 8;
const FIXED: usize = 16 << 10;

const CONTENT_TYPES: [Option<&str>; 6] = [
    None,
    Some("application/json"),
    Some("Application/JSON; charset=utf-8"),
    Some("text/plain; charset=utf-8"),
    Some("application/jsonx"),
    Some(" application/json ;"),
];

fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("application/json")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (content_type, body): (Option<String>, &[u8]) = match CONTENT_TYPES.get(selector as usize) {
        Some(ct) => (ct.map(str::to_owned), rest),
        None => {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            let Ok(ct) = std::str::from_utf8(&rest[..end]) else {
                return;
            };
            (Some(ct.to_owned()), rest.get(end + 1..).unwrap_or(&[]))
        }
    };
    let content_type = content_type.as_deref();
    let (result, peak) = measure(|| parse_webhook_body(content_type, body));
    check_alloc("parse_webhook_body", body.len(), peak, PER_BYTE, FIXED);
    match result {
        Ok((title, text)) => {
            assert!(
                text.len() <= body.len() && title.as_ref().is_none_or(|t| t.len() <= body.len())
            );
            if is_json(content_type) {
                if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                    panic!("accepted a JSON body that is not JSON ({e})");
                }
                // `Value` stops at 128 levels of nesting (skipping has no such limit, and needs
                // none: it does not recurse) and at what f64 or UTF-8 cannot hold (1e400, a lone
                // surrogate escape); those bodies are compared no further.
                if let Ok(value) = serde_json::from_slice::<Value>(body) {
                    assert!(
                        value.is_object(),
                        "accepted a JSON body that is not an object"
                    );
                    assert_eq!(
                        value.get("text").and_then(Value::as_str),
                        Some(text.as_str())
                    );
                    assert_eq!(value.get("title").and_then(Value::as_str), title.as_deref());
                }
            } else {
                assert_eq!(title, None);
                assert_eq!(text.as_bytes(), body, "a text body must be taken as sent");
            }
        }
        Err(HookError::BadRequest(message)) => {
            assert!(
                !message.is_empty() && message.len() <= body.len() + 1024,
                "a refusal message of {} bytes for a {}-byte body",
                message.len(),
                body.len()
            );
            if !is_json(content_type) {
                assert!(
                    std::str::from_utf8(body).is_err(),
                    "refused a UTF-8 text body"
                );
            }
        }
        Err(other) => panic!("a body parser may only answer 400, not {other:?}"),
    }
});
