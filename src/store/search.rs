//! The search index: an inverted index over message text, kept in sled as messages are stored.
//!
//! Posting key: `term 0x00 (u64::MAX - seq)`, value: the message's lane prefix. Inverting the
//! sequence number makes a forward scan of one term newest-first; a prefix query expands to the
//! distinct terms that start with it and merges their postings by sequence, so a query reads
//! only as many postings as it needs for `limit` hits (bounded by `MAX_POSTINGS_SCANNED`), never
//! the whole history. The lane prefix in the value lets chat scope filter without loading text.

use std::collections::{BTreeSet, BinaryHeap, HashSet};

use sled::transaction::{TransactionalTree, UnabortableTransactionError};

use super::{from_json, Result, Store};
use crate::protocol::{HistoryMessage, Lane};

/// Terms longer than this are cut: nobody searches for the 40th letter of a word, and the cut
/// bounds the size of a posting key.
pub const MAX_TERM_CHARS: usize = 32;
/// Distinct terms indexed per message: bounds what one huge message costs the index.
pub const MAX_TERMS_PER_MESSAGE: usize = 1000;
/// Distinct indexed terms a query prefix may expand to ("a" would otherwise touch them all).
const MAX_EXPANSIONS: usize = 64;
/// Postings one query may read before it answers with what it has.
const MAX_POSTINGS_SCANNED: usize = 50_000;
/// Characters of context on each side of the match in a snippet.
const SNIPPET_CONTEXT: usize = 60;

/// Splits text into index terms: lowercase, split on anything that is not a letter or digit.
/// "Zucchini's" gives "zucchini" and "s", so a search for "Zucchini" finds it.
pub fn terms(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in words(text) {
        out.insert(word.chars().take(MAX_TERM_CHARS).collect());
        if out.len() >= MAX_TERMS_PER_MESSAGE {
            break;
        }
    }
    out
}

/// The lowercased words of `text`, uncut.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.chars().flat_map(char::to_lowercase).collect())
}

/// Query words, lowercased like index terms but uncut: the index finds candidates by the
/// first `MAX_TERM_CHARS` characters, the full word then decides.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for w in words(query) {
        if !seen.contains(&w) {
            seen.push(w);
        }
    }
    seen
}

fn posting_key(term: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(term.len() + 9);
    k.extend_from_slice(term.as_bytes());
    k.push(0);
    k.extend_from_slice(&(u64::MAX - seq).to_be_bytes());
    k
}

/// Adds (or, with `remove`, drops) the postings of one message inside a transaction.
pub(super) fn index_message(
    search: &TransactionalTree,
    message_key: &[u8],
    text: &str,
    remove: bool,
) -> std::result::Result<(), UnabortableTransactionError> {
    let (lane_prefix, seq) = split_message_key(message_key);
    for term in terms(text) {
        let key = posting_key(&term, seq);
        if remove {
            search.remove(key)?;
        } else {
            search.insert(key, lane_prefix)?;
        }
    }
    Ok(())
}

fn split_message_key(key: &[u8]) -> (&[u8], u64) {
    let at = key.len().saturating_sub(8);
    (&key[..at], super::u64_from(&key[at..]))
}

/// Where a search looks.
#[derive(Debug, Clone)]
pub enum Scope {
    All,
    /// One channel (all its lanes), or one thread of it.
    Chat {
        chat_id: String,
        thread_id: Option<String>,
    },
}

impl Scope {
    fn admits(&self, lane_prefix: &[u8]) -> bool {
        match self {
            Scope::All => true,
            Scope::Chat { chat_id, thread_id } => {
                let mut want = chat_id.as_bytes().to_vec();
                want.push(0);
                match thread_id {
                    Some(t) => {
                        want.extend_from_slice(t.as_bytes());
                        want.push(0);
                        lane_prefix == want.as_slice()
                    }
                    None => lane_prefix.starts_with(&want),
                }
            }
        }
    }
}

/// One search result.
#[derive(Debug, Clone)]
pub struct Hit {
    pub lane: Lane,
    pub message: HistoryMessage,
    pub snippet: String,
}

impl Store {
    /// Messages matching every query word (each as a word prefix), newest first.
    pub fn search(&self, query: &[String], scope: &Scope, limit: usize) -> Result<Vec<Hit>> {
        let Some(primary) = query.iter().max_by_key(|w| w.len()) else {
            return Ok(Vec::new());
        };
        let lookup: String = primary.chars().take(MAX_TERM_CHARS).collect();
        let trees = self.t()?;
        let mut hits = Vec::new();
        let mut seen = HashSet::new();
        let mut consider = |seq: u64, lane_prefix: &[u8]| -> Result<bool> {
            if !seen.insert(seq) || !scope.admits(lane_prefix) {
                return Ok(false);
            }
            let mut key = lane_prefix.to_vec();
            key.extend_from_slice(&seq.to_be_bytes());
            let Some(raw) = trees.messages.get(&key)? else {
                return Ok(false);
            };
            let message: HistoryMessage = from_json(&raw, "history message")?;
            let msg_words: Vec<String> = words(&message.text).collect();
            let all_match = query
                .iter()
                .all(|w| msg_words.iter().any(|t| t.starts_with(w.as_str())));
            if all_match {
                let lane = super::history::lane_from_prefix(lane_prefix)
                    .unwrap_or_else(|| Lane::new("", None));
                let snippet = snippet(&message.text, query);
                hits.push(Hit {
                    lane,
                    message,
                    snippet,
                });
            }
            Ok(hits.len() >= limit)
        };
        match self.expand_prefix(&lookup)? {
            Some(expansions) => {
                // Few terms share the prefix: merge their newest-first posting lists, reading
                // only as far as `limit` hits need.
                let mut cursors: Vec<sled::Iter> = expansions
                    .iter()
                    .map(|t| {
                        let mut lo = t.as_bytes().to_vec();
                        lo.push(0);
                        let mut hi = t.as_bytes().to_vec();
                        hi.push(1);
                        trees.search_idx.range(lo..hi)
                    })
                    .collect();
                let mut heap = BinaryHeap::new();
                for (i, c) in cursors.iter_mut().enumerate() {
                    if let Some(item) = c.next() {
                        let (k, v) = item?;
                        heap.push((posting_seq(&k), i, v));
                    }
                }
                let mut scanned = 0;
                while let Some((seq, i, lane_prefix)) = heap.pop() {
                    scanned += 1;
                    if let Some(item) = cursors[i].next() {
                        let (k, v) = item?;
                        heap.push((posting_seq(&k), i, v));
                    }
                    if consider(seq, &lane_prefix)? || scanned >= MAX_POSTINGS_SCANNED {
                        break;
                    }
                }
            }
            None => {
                // A short prefix shared by many terms: gather its postings (bounded), newest first.
                let mut postings = Vec::new();
                for item in trees
                    .search_idx
                    .scan_prefix(lookup.as_bytes())
                    .take(MAX_POSTINGS_SCANNED)
                {
                    let (k, v) = item?;
                    postings.push((posting_seq(&k), v));
                }
                postings.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
                for (seq, lane_prefix) in postings {
                    if consider(seq, &lane_prefix)? {
                        break;
                    }
                }
            }
        }
        Ok(hits)
    }

    /// The distinct indexed terms starting with `prefix`, skipping from one term to the next
    /// without reading their postings.
    /// `None` when more than `MAX_EXPANSIONS` terms share the prefix.
    fn expand_prefix(&self, prefix: &str) -> Result<Option<Vec<String>>> {
        let mut out = Vec::new();
        let mut from = prefix.as_bytes().to_vec();
        let t = self.t()?;
        loop {
            if out.len() == MAX_EXPANSIONS {
                return Ok(None);
            }
            let Some(item) = t.search_idx.range(from.as_slice()..).next() else {
                break;
            };
            let (k, _) = item?;
            if !k.starts_with(prefix.as_bytes()) {
                break;
            }
            let end = k.iter().position(|b| *b == 0).unwrap_or(k.len());
            let term = String::from_utf8_lossy(&k[..end]).into_owned();
            from = k[..end].to_vec();
            from.push(1);
            out.push(term);
        }
        Ok(Some(out))
    }

    /// (postings, bytes of their keys and values): the index's logical size, for the
    /// benchmark's bytes-per-message figure. Walks the whole index: not for the serving path.
    pub fn search_index_size(&self) -> Result<(usize, u64)> {
        let mut n = 0;
        let mut bytes = 0u64;
        for item in self.t()?.search_idx.iter() {
            let (k, v) = item?;
            n += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        Ok((n, bytes))
    }

    /// Every stored message, oldest lane first: only the benchmark's naive-scan baseline uses it.
    pub fn all_messages(&self) -> Box<dyn Iterator<Item = Result<HistoryMessage>>> {
        match self.t() {
            Ok(t) => Box::new(
                t.messages
                    .iter()
                    .values()
                    .map(|v| from_json(&v?, "history message")),
            ),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }
}

fn posting_seq(key: &[u8]) -> u64 {
    let at = key.len().saturating_sub(8);
    u64::MAX - super::u64_from(&key[at..])
}

/// A short excerpt of `text` around the first word that matches a query word: up to
/// `SNIPPET_CONTEXT` characters on each side of it.
pub fn snippet(text: &str, words: &[String]) -> String {
    let mut at = 0;
    let mut word_chars = 0;
    let mut offset = 0;
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let lower: String = word.chars().flat_map(char::to_lowercase).collect();
        if !word.is_empty() && words.iter().any(|w| lower.starts_with(w.as_str())) {
            at = offset;
            word_chars = word.chars().count();
            break;
        }
        offset += word.len()
            + text[offset + word.len()..]
                .chars()
                .next()
                .map_or(0, char::len_utf8);
    }
    let before: Vec<char> = text[..at].chars().rev().take(SNIPPET_CONTEXT + 1).collect();
    let keep_after = word_chars + SNIPPET_CONTEXT;
    let after: Vec<char> = text[at..].chars().take(keep_after + 1).collect();
    let mut s = String::new();
    if before.len() > SNIPPET_CONTEXT {
        s.push('\u{2026}');
    }
    s.extend(before.iter().take(SNIPPET_CONTEXT).rev());
    s.extend(after.iter().take(keep_after));
    if after.len() > keep_after {
        s.push('\u{2026}');
    }
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{msg, temp_store};
    use crate::store::Change;

    #[test]
    fn terms_fold_case_and_split_on_non_letters() {
        let t = terms("Zucchini's GRÜN-Tee, 42x!");
        let v: Vec<_> = t.iter().map(String::as_str).collect();
        assert_eq!(v, ["42x", "grün", "s", "tee", "zucchini"]);
    }

    #[test]
    fn finds_by_prefix_newest_first_and_respects_scope() {
        let (_d, s) = temp_store();
        let a = Lane::new("default", None);
        let b = Lane::new("chan_b", Some("thr_1"));
        s.commit(&[Change::PutMessage(
            a.clone(),
            msg("m1", "I planted zucchini"),
        )])
        .unwrap();
        s.commit(&[Change::PutMessage(
            b.clone(),
            msg("m2", "The zucchini's leaves"),
        )])
        .unwrap();
        s.commit(&[Change::PutMessage(
            a.clone(),
            msg("m3", "zucchinis everywhere, help"),
        )])
        .unwrap();
        s.commit(&[Change::PutMessage(a.clone(), msg("m4", "tomatoes only"))])
            .unwrap();
        let ids = |hits: Vec<Hit>| {
            hits.into_iter()
                .map(|h| h.message.message_id)
                .collect::<Vec<_>>()
        };
        let q = query_terms("Zucchini");
        assert_eq!(
            ids(s.search(&q, &Scope::All, 10).unwrap()),
            ["m3", "m2", "m1"]
        );
        assert_eq!(ids(s.search(&q, &Scope::All, 2).unwrap()), ["m3", "m2"]);
        let chat = Scope::Chat {
            chat_id: "default".into(),
            thread_id: None,
        };
        assert_eq!(ids(s.search(&q, &chat, 10).unwrap()), ["m3", "m1"]);
        let thread = Scope::Chat {
            chat_id: "chan_b".into(),
            thread_id: Some("thr_1".into()),
        };
        assert_eq!(ids(s.search(&q, &thread, 10).unwrap()), ["m2"]);
        // Every word must match.
        assert_eq!(
            ids(s
                .search(&query_terms("zucc help"), &Scope::All, 10)
                .unwrap()),
            ["m3"]
        );
        assert!(s
            .search(&query_terms("pumpkin"), &Scope::All, 10)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn replacing_a_message_reindexes_it() {
        let (_d, s) = temp_store();
        let a = Lane::new("default", None);
        s.commit(&[Change::PutMessage(
            a.clone(),
            msg("m1", "draft about apples"),
        )])
        .unwrap();
        s.commit(&[Change::PutMessage(
            a.clone(),
            msg("m1", "final about pears"),
        )])
        .unwrap();
        assert!(s
            .search(&query_terms("apples"), &Scope::All, 10)
            .unwrap()
            .is_empty());
        assert_eq!(
            s.search(&query_terms("pears"), &Scope::All, 10)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn snippets_center_on_the_match() {
        let long = format!(
            "{} the zucchini grew {}",
            "a ".repeat(100),
            "b ".repeat(100)
        );
        let s = snippet(&long, &query_terms("zucchini"));
        assert!(s.starts_with('\u{2026}') && s.ends_with('\u{2026}'), "{s}");
        assert!(s.contains("the zucchini grew"), "{s}");
        assert_eq!(snippet("Zucchini!", &query_terms("zuc")), "Zucchini!");
    }
}
