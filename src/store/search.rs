//! Search over message text: the history database's FTS5 index (`sql.rs`, table `search`),
//! kept by triggers on the messages table, so it never disagrees with history.
//!
//! FTS5's `unicode61` tokenizer (diacritics kept) splits text on everything that is not a
//! letter or digit and folds case, as `words` below does; each query word becomes a prefix
//! query (`"word"*`), all of them required. FTS5 returns candidates newest first (by position),
//! and each is checked against the query words with the same splitting as before (`words`), so
//! what matches does not depend on the tokenizer's corner cases. A query reads at most
//! `MAX_SCANNED` candidates, never all history.

use super::{Result, Store};
use crate::protocol::{HistoryMessage, Lane};

/// Candidates one query may look at before it answers with what it has.
const MAX_SCANNED: usize = 50_000;
/// Characters of context on each side of the match in a snippet.
const SNIPPET_CONTEXT: usize = 60;

/// The lowercased words of `text`, uncut.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.chars().flat_map(char::to_lowercase).collect())
}

/// Query words, lowercased, each once.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for w in words(query) {
        if !seen.contains(&w) {
            seen.push(w);
        }
    }
    seen
}

/// The FTS5 query for `words`: each a quoted prefix, all required.
fn fts_query(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"*", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" ")
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
        if query.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let t = self.read_history()?;
        let filter = match scope {
            Scope::All => (None, None),
            Scope::Chat { chat_id, thread_id } => (
                Some(chat_id.as_str()),
                // A thread is a lane of its own; the channel itself is every lane of it.
                thread_id.as_deref(),
            ),
        };
        let mut hits = Vec::new();
        t.hist
            .search(&fts_query(query), filter, MAX_SCANNED, |lane, message| {
                let msg_words: Vec<String> = words(&message.text).collect();
                let all_match = query
                    .iter()
                    .all(|w| msg_words.iter().any(|t| t.starts_with(w.as_str())));
                if all_match {
                    let snippet = snippet(&message.text, query);
                    hits.push(Hit {
                        lane,
                        message,
                        snippet,
                    });
                }
                Ok(hits.len() >= limit)
            })?;
        Ok(hits)
    }

    /// How many messages history holds (counts them all: for the benchmarks only).
    pub fn message_count(&self) -> Result<u64> {
        self.read_history()?.hist.count()
    }

    /// Every stored message, oldest first: only the benchmark's naive-scan baseline uses it.
    pub fn all_messages(&self) -> Result<Vec<HistoryMessage>> {
        let mut out = Vec::new();
        self.read_history()?.hist.export(
            |_, _, m| {
                out.push(m.clone());
                Ok(())
            },
            |_, _| Ok(()),
        )?;
        Ok(out)
    }
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
        s.sync_blocking().unwrap();
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
        s.sync_blocking().unwrap();
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
