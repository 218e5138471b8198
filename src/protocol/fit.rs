//! Outgoing sizes: what a value costs once JSON-encoded, cutting text to an encoded budget, and
//! the last-resort shrink that keeps every frame the gateway writes within
//! `limits.max_out_frame_bytes`.
//!
//! Raw lengths lie about wire sizes: JSON escaping turns one control character into six bytes
//! (`\u0001`), so a 400 KB reply can encode to 2.4 MB. Every budget here is therefore counted in
//! *encoded* bytes, exactly as `serde_json` writes them. Producers (the hub) cut their content
//! to the shares in [`OutBudget`]; [`shrink_encoded`] is the safety net the writer applies to any
//! frame that still does not fit (a frame stored by an older version, a path that forgot its
//! budget), so no frame can ever be too big for the app to take.

use bytes::Bytes;
use serde_json::Value;

use super::HistoryMessage;

/// Room left in every frame for what surrounds the budgeted content: the envelope, ids, a
/// message's media refs (10 of them, ~4 KB), model and runtime, and the `cursor` that `sync`
/// splices in.
pub const OUT_RESERVE: usize = 16 << 10;

/// Strings shorter than this are never cut by the last-resort shrink: ids, names, codes and
/// enum values stay intact, only bulk text is shortened.
const MIN_CUTTABLE: usize = 256;

/// Tool previews, progress notes, output previews and search snippets: a glance, not the text.
pub const PREVIEW_BYTES: usize = 8 << 10;

/// One search hit's snippet, encoded: 100 hits stay far below any frame budget.
pub const SNIPPET_BYTES: usize = 1 << 10;

/// Room each share leaves for the rest of a message (ids, role, ts, model, runtime, media),
/// so a message with both shares full still fits `content` on its own.
const MESSAGE_FIELDS: usize = 4 << 10;

/// What each kind of outgoing content may take, derived from one named limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutBudget {
    /// `limits.max_out_frame_bytes`: no frame on the wire is longer.
    pub frame: usize,
    /// What a producer may fill: the frame less [`OUT_RESERVE`].
    pub content: usize,
    /// A message's text (agent reply, user message): 5/8 of the content, less room for the
    /// message's other fields.
    pub text: usize,
    /// A message's reasoning: the other 3/8 (likewise), so text and reasoning together fit one
    /// `message.stop` or one history entry.
    pub reasoning: usize,
}

impl OutBudget {
    pub fn new(max_out_frame_bytes: usize) -> OutBudget {
        let content = max_out_frame_bytes.saturating_sub(OUT_RESERVE);
        OutBudget {
            frame: max_out_frame_bytes,
            content,
            text: (content / 8 * 5).saturating_sub(MESSAGE_FIELDS),
            reasoning: (content / 8 * 3).saturating_sub(MESSAGE_FIELDS),
        }
    }
}

/// The bytes `serde_json` writes for one character inside a string.
fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{08}' | '\u{0c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Encoded length of `s` as a JSON string's content (without the two quotes).
pub fn escaped_len(s: &str) -> usize {
    s.chars().map(escaped_char_len).sum()
}

/// The longest prefix of `s`, on a character boundary, whose escaped length is at most `budget`.
pub fn prefix_within(s: &str, budget: usize) -> &str {
    let mut used = 0;
    for (at, c) in s.char_indices() {
        used += escaped_char_len(c);
        if used > budget {
            return &s[..at];
        }
    }
    s
}

/// The note that replaces what was cut, saying how much is missing.
pub fn cut_marker(bytes_cut: usize) -> String {
    format!(" [\u{2026} {bytes_cut} more bytes cut: too long to send]")
}

/// `s` cut so that its escaped length, marker included, is at most `budget`; `None` when it
/// already fits. A budget too small for the marker gets a bare prefix.
pub fn cut_to_escaped(s: &str, budget: usize) -> Option<String> {
    if escaped_len(s) <= budget {
        return None;
    }
    // The marker's own length depends on the number it carries; size it for the whole string.
    let marker_room = escaped_len(&cut_marker(s.len()));
    if budget < marker_room {
        return Some(prefix_within(s, budget).to_owned());
    }
    let keep = prefix_within(s, budget - marker_room);
    let mut out = String::with_capacity(keep.len() + marker_room);
    out.push_str(keep);
    out.push_str(&cut_marker(s.len() - keep.len()));
    debug_assert!(escaped_len(&out) <= budget);
    Some(out)
}

/// Cuts `s` in place to `budget` escaped bytes (see [`cut_to_escaped`]); true if it was cut.
pub fn cut_in_place(s: &mut String, budget: usize) -> bool {
    match cut_to_escaped(s, budget) {
        Some(cut) => {
            *s = cut;
            true
        }
        None => false,
    }
}

/// Cuts a message's text and reasoning to their shares of the budget, so one message always
/// fits one frame (`message`, `message.stop`, a history page of one). True if it was cut.
pub fn fit_message(m: &mut HistoryMessage, budget: &OutBudget) -> bool {
    let text = cut_in_place(&mut m.text, budget.text);
    let reasoning = m
        .reasoning
        .as_mut()
        .is_some_and(|r| cut_in_place(r, budget.reasoning));
    text || reasoning
}

/// Per-message slack in a history page: the separating comma, and the role `history` rewrites
/// (`cron` and `system` page in as the longer `assistant`).
const HISTORY_ENTRY_SLACK: usize = 16;

/// The newest messages of a page (chronological order in and out) that fit `budget.content`
/// together. Returns the messages kept and whether older ones were left out, in which case the
/// page must say `has_more` and its `oldest_message_id` is the oldest kept, so the app pages on
/// from there. The newest message is always kept, cut to fit if it alone is too big: a page
/// is never empty while the lane has messages.
pub fn history_within(
    mut messages: Vec<HistoryMessage>,
    budget: &OutBudget,
) -> (Vec<HistoryMessage>, bool) {
    let mut used = 0;
    let mut keep = 0;
    for m in messages.iter_mut().rev() {
        let mut size = serde_json::to_vec(m).map_or(usize::MAX, |b| b.len()) + HISTORY_ENTRY_SLACK;
        if keep == 0 && size > budget.content {
            fit_message(m, budget);
            size = serde_json::to_vec(m).map_or(usize::MAX, |b| b.len()) + HISTORY_ENTRY_SLACK;
        }
        if keep > 0 && used + size > budget.content {
            break;
        }
        used += size;
        keep += 1;
    }
    let left_out = messages.len() - keep;
    messages.drain(..left_out);
    (messages, left_out > 0)
}

fn encoded_len(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// Where the largest cuttable piece of a value is: a string to shorten, or a container to
/// drop trailing elements from.
enum Largest {
    Str(Vec<PathStep>, usize),
    Container(Vec<PathStep>),
}

#[derive(Clone)]
enum PathStep {
    Index(usize),
    Key(String),
}

fn walk(v: &Value, path: &mut Vec<PathStep>, best_str: &mut Option<(Vec<PathStep>, usize)>) {
    match v {
        Value::String(s) => {
            let len = escaped_len(s);
            if len >= MIN_CUTTABLE && best_str.as_ref().is_none_or(|(_, b)| len > *b) {
                *best_str = Some((path.clone(), len));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(PathStep::Index(i));
                walk(item, path, best_str);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                path.push(PathStep::Key(k.clone()));
                walk(item, path, best_str);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The largest array or object below the frame's top level (the envelope and its `payload`
/// object themselves are never emptied), by encoded size.
fn largest_container(
    v: &Value,
    path: &mut Vec<PathStep>,
    best: &mut Option<(Vec<PathStep>, usize)>,
) {
    let (children, is_container): (Vec<(PathStep, &Value)>, bool) = match v {
        Value::Array(items) => (
            items
                .iter()
                .enumerate()
                .map(|(i, x)| (PathStep::Index(i), x))
                .collect(),
            true,
        ),
        Value::Object(map) => (
            map.iter()
                .map(|(k, x)| (PathStep::Key(k.clone()), x))
                .collect(),
            true,
        ),
        _ => (Vec::new(), false),
    };
    if is_container && path.len() >= 2 && !children.is_empty() {
        let len = encoded_len(v);
        if best.as_ref().is_none_or(|(_, b)| len > *b) {
            *best = Some((path.clone(), len));
        }
    }
    for (step, child) in children {
        path.push(step);
        largest_container(child, path, best);
        path.pop();
    }
}

fn find_largest(v: &Value) -> Option<Largest> {
    let mut best = None;
    walk(v, &mut Vec::new(), &mut best);
    if let Some((p, len)) = best {
        return Some(Largest::Str(p, len));
    }
    let mut best = None;
    largest_container(v, &mut Vec::new(), &mut best);
    best.map(|(p, _)| Largest::Container(p))
}

fn at_path<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match step {
            PathStep::Index(i) => cur.get_mut(*i)?,
            PathStep::Key(k) => cur.get_mut(k.as_str())?,
        };
    }
    Some(cur)
}

/// Shrinks `v` until it encodes to at most `max` bytes: first the longest strings are cut (with
/// a marker), then, when no long string is left, trailing elements of the largest nested array
/// or object are dropped. Returns false if it cannot get there (a frame made of nothing but
/// short fields, which no input within its limits can produce).
pub fn shrink_value(v: &mut Value, max: usize) -> bool {
    // Each pass removes at least the excess from one piece, so a handful of passes suffice;
    // the bound only guards against a pathological shape.
    for _ in 0..256 {
        let size = encoded_len(v);
        if size <= max {
            return true;
        }
        let excess = size - max;
        match find_largest(v) {
            Some(Largest::Str(path, len)) => {
                let Some(Value::String(s)) = at_path(v, &path) else {
                    return false;
                };
                // Cut the excess out of this string if it has that much; else cut it to a
                // stub and let the next pass take the next longest.
                let budget = len.saturating_sub(excess).max(MIN_CUTTABLE / 4);
                let budget = budget.min(len.saturating_sub(1));
                if !cut_in_place(s, budget) {
                    return false;
                }
            }
            Some(Largest::Container(path)) => match at_path(v, &path) {
                Some(Value::Array(items)) => {
                    let avg = (encoded_len(&Value::Array(items.clone())) / items.len()).max(1);
                    let drop = (excess / avg + 1).min(items.len());
                    items.truncate(items.len() - drop);
                }
                Some(Value::Object(map)) => {
                    let avg = (encoded_len(&Value::Object(map.clone())) / map.len()).max(1);
                    let drop = (excess / avg + 1).min(map.len());
                    let keys: Vec<String> = map.keys().rev().take(drop).cloned().collect();
                    for k in keys {
                        map.remove(&k);
                    }
                }
                _ => return false,
            },
            None => return false,
        }
    }
    encoded_len(v) <= max
}

/// A frame already encoded that does not fit `max`: decoded, shrunk and encoded again. `None`
/// when it cannot be made to fit (or is not JSON, which no frame of the gateway is).
pub fn shrink_encoded(encoded: &[u8], max: usize) -> Option<Bytes> {
    if encoded.len() <= max {
        return Some(Bytes::copy_from_slice(encoded));
    }
    let mut v: Value = serde_json::from_slice(encoded).ok()?;
    if !shrink_value(&mut v, max) {
        return None;
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escaped_len_matches_serde_json() {
        for s in [
            "plain",
            "quote \" and \\ back",
            "\u{1}\u{2}\u{1f}\n\t\r\u{8}\u{c}",
            "grün 🌱 日本",
            "\u{7f}\u{2028}",
        ] {
            let enc = serde_json::to_string(s).unwrap();
            assert_eq!(escaped_len(s) + 2, enc.len(), "{s:?}");
        }
    }

    #[test]
    fn cut_keeps_char_boundaries_and_the_budget() {
        let s = "é\u{1}".repeat(10_000);
        for budget in [0, 5, 40, 100, 1000, 33_333] {
            let cut = cut_to_escaped(&s, budget).unwrap();
            assert!(escaped_len(&cut) <= budget, "budget {budget}");
            if budget >= 100 {
                assert!(cut.contains("more bytes cut"));
            }
        }
        assert!(cut_to_escaped("short", 100).is_none());
    }

    #[test]
    fn shrink_cuts_the_longest_string_first() {
        let mut v = json!({"v":1,"type":"message.stop","payload":{
            "message_id":"msg_1","final_text":"\u{1}".repeat(100_000),"reasoning":"r".repeat(5000)}});
        assert!(shrink_value(&mut v, 60_000));
        let enc = serde_json::to_vec(&v).unwrap();
        assert!(enc.len() <= 60_000);
        assert_eq!(v["payload"]["message_id"], "msg_1");
        assert_eq!(v["payload"]["reasoning"].as_str().unwrap().len(), 5000);
    }

    #[test]
    fn shrink_drops_trailing_elements_when_no_long_string_is_left() {
        let items: Vec<Value> = (0..50_000).map(|i| json!(i)).collect();
        let mut v = json!({"v":1,"type":"tool.start","payload":{"index":0,"args":{"xs": items}}});
        assert!(shrink_value(&mut v, 10_000));
        assert!(serde_json::to_vec(&v).unwrap().len() <= 10_000);
        assert_eq!(v["payload"]["index"], 0);
    }

    #[test]
    fn shrink_encoded_leaves_small_frames_alone() {
        let enc = br#"{"v":1,"type":"pong","payload":{"ts":1}}"#;
        assert_eq!(&shrink_encoded(enc, 1000).unwrap()[..], &enc[..]);
    }

    #[test]
    fn budgets_add_up_to_the_frame() {
        let b = OutBudget::new(1 << 20);
        assert!(b.text + b.reasoning + OUT_RESERVE <= b.frame);
        assert_eq!(b.content, (1 << 20) - OUT_RESERVE);
    }
}
