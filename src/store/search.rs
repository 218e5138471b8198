//! Search over message text: the history database's FTS5 index (`sql.rs`, table `search`),
//! kept by triggers on the messages table, so it never disagrees with history.
//!
//! The index holds each message's words as `fold::words` makes them (normalised, case-folded),
//! split again by FTS5's `ascii` tokenizer at exactly the same places; each query word,
//! folded the same way, becomes a prefix query (`"word"*`), all of them required. So a term
//! the index holds is a term a query can name and the reverse: no candidate is read only to
//! be rejected. FTS5 returns candidates newest first (by position); each is still checked
//! against the query words (cheap, and the snippet needs the match). A query reads at most
//! `MAX_SCANNED` candidates, never all history.
//!
//! The queries run on the history database's query thread (`Store::query`), never on the
//! event loop.

use super::base::Result;
use super::engine::handle::Store;
use super::fold::{is_word_char, words};
use crate::protocol::{HistoryMessage, Lane};

/// Candidates one query may look at before it answers with what it has.
const MAX_SCANNED: usize = 50_000;
/// Characters of context on each side of the match in a snippet.
const SNIPPET_CONTEXT: usize = 60;

/// Query words, folded, each once.
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
    /// Messages matching every query word (each as a word prefix), newest first. Runs on the
    /// query thread; also returns how long it took there (the device's query budget).
    pub async fn query_search(
        &self,
        query: Vec<String>,
        scope: Scope,
        limit: usize,
    ) -> Result<(Vec<Hit>, std::time::Duration)> {
        self.query(move |q| search_in(q, &query, &scope, limit))
            .await
    }

    /// `query_search`, on this thread (tools, tests, benchmarks).
    pub fn search(&self, query: &[String], scope: &Scope, limit: usize) -> Result<Vec<Hit>> {
        self.query_blocking(|q| search_in(q, query, scope, limit))
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

fn search_in(
    q: &super::sql_query::Query<'_>,
    query: &[String],
    scope: &Scope,
    limit: usize,
) -> Result<Vec<Hit>> {
    if query.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let filter = match scope {
        Scope::All => (None, None),
        Scope::Chat { chat_id, thread_id } => (
            Some(chat_id.as_str()),
            // A thread is a lane of its own; the channel itself is every lane of it.
            thread_id.as_deref(),
        ),
    };
    let mut hits = Vec::new();
    q.search(&fts_query(query), filter, MAX_SCANNED, |lane, message| {
        let msg_words = words(&message.text);
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

/// A short excerpt of `text` around the first word that matches a query word: up to
/// `SNIPPET_CONTEXT` characters on each side of it.
pub fn snippet(text: &str, words: &[String]) -> String {
    let mut at = 0;
    let mut word_chars = 0;
    let mut offset = 0;
    for word in text.split(|c: char| !is_word_char(c)) {
        let folded = super::fold::words(word);
        if folded
            .iter()
            .any(|f| words.iter().any(|w| f.starts_with(w.as_str())))
        {
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

    #[test]
    fn case_variants_and_normalisation_forms_find_each_other() {
        let (_d, s) = temp_store();
        let a = Lane::new("default", None);
        for (id, text) in [
            ("upper", "ΣΑΣ ΕΥΧΑΡΙΣΤΟΥΜΕ"),
            ("lower", "σας ευχαριστούμε"),
            ("dotted", "İstanbul in May"),
            ("composed", "caf\u{e9} tonight"),
            ("decomposed", "cafe\u{301} tomorrow"),
        ] {
            s.commit(&[Change::PutMessage(a.clone(), msg(id, text))])
                .unwrap();
        }
        s.sync_blocking().unwrap();
        let found = |q: &str| {
            let mut ids: Vec<String> = s
                .search(&query_terms(q), &Scope::All, 10)
                .unwrap()
                .into_iter()
                .map(|h| h.message.message_id)
                .collect();
            ids.sort();
            ids
        };
        assert_eq!(found("σας"), ["lower", "upper"]);
        assert_eq!(found("ΣΑΣ"), ["lower", "upper"]);
        assert_eq!(found("istanbul"), ["dotted"]);
        assert_eq!(found("İSTANBUL"), ["dotted"]);
        assert_eq!(found("caf\u{e9}"), ["composed", "decomposed"]);
        assert_eq!(found("cafe\u{301}"), ["composed", "decomposed"]);
        // What the index cannot see is not a candidate either: nothing to read and reject.
        assert!(found("n \u{19b0}").is_empty());
        let snip = snippet("Wir sehen uns in İstanbul!", &query_terms("istan"));
        assert_eq!(snip, "Wir sehen uns in İstanbul!");
    }
}
