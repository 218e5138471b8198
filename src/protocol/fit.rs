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

/// Encoded length of `s` as a JSON string's content (without the two quotes). Counted per
/// byte: only ASCII bytes are ever escaped, and every byte of a multi-byte character is
/// written as it is.
pub fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
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

/// Appends a streamed `delta` to `text`, whose escaped length `escaped` tracks, within `budget`
/// escaped bytes. When the delta does not fit, what fits of it is kept, then `note` (for which
/// room is always left), and true is returned: the caller stops appending. The agent's text is
/// budgeted as it streams, so `message.update` (which carries the whole text so far) and the
/// final `message.stop` never outgrow their frame.
pub fn push_within(
    text: &mut String,
    escaped: &mut usize,
    delta: &str,
    budget: usize,
    note: &str,
) -> bool {
    let room = budget.saturating_sub(*escaped + escaped_len(note));
    let add = escaped_len(delta);
    if add <= room {
        text.push_str(delta);
        *escaped += add;
        return false;
    }
    let keep = prefix_within(delta, room);
    text.push_str(keep);
    text.push_str(note);
    *escaped += escaped_len(keep) + escaped_len(note);
    true
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

/// Encoded size of a value as `serde_json` writes it compactly, without writing it.
fn encoded_len(v: &Value) -> usize {
    match v {
        Value::Null => 4,
        Value::Bool(b) => {
            if *b {
                4
            } else {
                5
            }
        }
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => escaped_len(s) + 2,
        Value::Array(items) => {
            2 + items.iter().map(encoded_len).sum::<usize>() + items.len().saturating_sub(1)
        }
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, x)| escaped_len(k) + 3 + encoded_len(x))
                .sum::<usize>()
                + map.len().saturating_sub(1)
        }
    }
}

/// Escaped lengths of every string long enough to be cut.
fn cuttable_lengths(v: &Value, out: &mut Vec<usize>) {
    match v {
        Value::String(s) => {
            let len = escaped_len(s);
            if len >= MIN_CUTTABLE {
                out.push(len);
            }
        }
        Value::Array(items) => items.iter().for_each(|x| cuttable_lengths(x, out)),
        Value::Object(map) => map.values().for_each(|x| cuttable_lengths(x, out)),
        _ => {}
    }
}

/// Cuts every cuttable string longer than `level` to `level` escaped bytes (marker included).
fn cut_above(v: &mut Value, level: usize) {
    match v {
        Value::String(s) if escaped_len(s) >= MIN_CUTTABLE => {
            cut_in_place(s, level);
        }
        Value::Array(items) => items.iter_mut().for_each(|x| cut_above(x, level)),
        Value::Object(map) => map.values_mut().for_each(|x| cut_above(x, level)),
        _ => {}
    }
}

/// The highest level such that cutting every string above it to it saves at least `need`
/// bytes ("water-filling": the longest strings are cut first, all to the same length, so a
/// frame with one huge field loses only that field's tail). `None` when even the floor does
/// not save enough.
fn water_level(lens: &[usize], need: usize) -> Option<usize> {
    let floor = MIN_CUTTABLE / 4;
    let saved = |level: usize| lens.iter().map(|l| l.saturating_sub(level)).sum::<usize>();
    if saved(floor) < need {
        return None;
    }
    let (mut lo, mut hi) = (floor, lens.iter().copied().max().unwrap_or(floor));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if saved(mid) >= need {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// The largest array or object below the frame's top level (the envelope and its `payload`
/// object are never emptied), as its path.
fn largest_container(v: &Value, depth: usize, best: &mut Option<(usize, *const Value)>) {
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(map) => Box::new(map.values()),
        _ => return,
    };
    let nonempty = match v {
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
        _ => false,
    };
    if depth >= 2 && nonempty {
        let len = encoded_len(v);
        if best.is_none_or(|(b, _)| len > b) {
            *best = Some((len, v as *const Value));
        }
    }
    for child in children {
        largest_container(child, depth + 1, best);
    }
}

/// Drops trailing elements of the largest nested container until `need` bytes are saved.
fn drop_trailing(v: &mut Value, need: usize) -> bool {
    let mut best = None;
    largest_container(v, 0, &mut best);
    let Some((_, target)) = best else {
        return false;
    };
    drop_in(v, target, need)
}

fn drop_in(v: &mut Value, target: *const Value, need: usize) -> bool {
    if std::ptr::eq(v as *const Value, target) {
        let mut saved = 0;
        match v {
            Value::Array(items) => {
                while saved < need {
                    match items.pop() {
                        Some(x) => saved += encoded_len(&x) + 1,
                        None => break,
                    }
                }
            }
            Value::Object(map) => {
                while saved < need {
                    let Some(k) = map.keys().next_back().cloned() else {
                        break;
                    };
                    if let Some(x) = map.remove(&k) {
                        saved += escaped_len(&k) + 4 + encoded_len(&x);
                    }
                }
            }
            _ => return false,
        }
        return true;
    }
    match v {
        Value::Array(items) => items.iter_mut().any(|x| drop_in(x, target, need)),
        Value::Object(map) => map.values_mut().any(|x| drop_in(x, target, need)),
        _ => false,
    }
}

/// Shrinks `v` until it encodes to at most `max` bytes: first the longest strings are cut
/// (with a marker), all to one level; when cutting strings cannot save enough, trailing
/// elements of the largest nested array or object are dropped. Returns false if it cannot get
/// there (a frame made of nothing but short fields, which no input within its limits makes).
pub fn shrink_value(v: &mut Value, max: usize) -> bool {
    // Each pass either fits or removes a whole layer of excess; a few passes suffice, the
    // bound only guards against a pathological shape.
    for _ in 0..16 {
        let size = encoded_len(v);
        if size <= max {
            return true;
        }
        let excess = size - max;
        let mut lens = Vec::new();
        cuttable_lengths(v, &mut lens);
        match water_level(&lens, excess) {
            Some(level) => cut_above(v, level),
            None => {
                cut_above(v, MIN_CUTTABLE / 4);
                let size = encoded_len(v);
                if size > max && !drop_trailing(v, size - max) {
                    return false;
                }
            }
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
