//! The one folding of text that search uses, for what it indexes and for what it is asked:
//! both sides go through `words`, so a query matches exactly what the index holds.
//!
//! Text is normalised to NFKC (a decomposed "é" is the composed one, "ﬁ" is "fi", a
//! full-width "Ａ" is "a"), then case-folded: the full lowercase mapping plus what Unicode's
//! default case folding does differently (final sigma "ς" is "σ", "ß" and "ẞ" are "ss",
//! the ypogegrammeni is "ι"), and the dot that lowercasing "İ" leaves after the "i" is dropped,
//! so "istanbul" finds "İstanbul". Diacritics are kept ("grün" does not find "grun").
//!
//! A word is a run of letters, digits and combining marks (a mark with no precomposed form
//! stays part of its word instead of splitting it). The index gets the words joined by spaces
//! and FTS5's `ascii` tokenizer splits them again exactly there (it treats every non-ASCII
//! character as part of a word), so the index sees every character a query can name.
//!
//! Changing what `fold` returns changes what the index holds: it needs a new history schema
//! whose migration re-indexes (`sql.rs`, `SCHEMA`).

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// Whether `c` belongs to a word (anything else separates words).
pub(super) fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || is_combining_mark(c)
}

/// `text` normalised and case-folded.
pub fn fold(text: &str) -> String {
    // ASCII is its own NFKC, and its case folding is its lowercase: most text, at no cost.
    if text.is_ascii() {
        return text.to_ascii_lowercase();
    }
    let mut out = String::with_capacity(text.len());
    for c in text.nfkc() {
        match c {
            'ς' => out.push('σ'),
            'ß' | 'ẞ' => out.push_str("ss"),
            '\u{345}' => out.push('ι'),
            _ => {
                for l in c.to_lowercase() {
                    if l == '\u{307}' && out.ends_with('i') {
                        continue;
                    }
                    out.push(l);
                }
            }
        }
    }
    // Lowercasing can leave a base and a mark apart that NFC joins ("İ" → "i̇" aside).
    if out.is_ascii() {
        out
    } else {
        out.nfc().collect()
    }
}

/// The folded words of `text`, in order.
pub fn words(text: &str) -> Vec<String> {
    fold(text)
        .split(|c: char| !is_word_char(c))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What the search index stores for a message's text: its folded words, space-separated.
pub(super) fn index_text(text: &str) -> String {
    words(text).join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_case_the_way_search_promises() {
        assert_eq!(words("ΣΑΣ σας"), ["σασ", "σασ"]);
        assert_eq!(words("İstanbul istanbul ISTANBUL"), ["istanbul"; 3]);
        assert_eq!(words("caf\u{e9} cafe\u{301}"), ["caf\u{e9}", "caf\u{e9}"]);
        assert_eq!(words("Straße STRASSE"), ["strasse", "strasse"]);
        assert_eq!(
            words("Zucchini's GRÜN-Tee"),
            ["zucchini", "s", "grün", "tee"]
        );
        assert_eq!(words("ﬁne Ｆｕｌｌ"), ["fine", "full"]);
        // A mark without a precomposed form stays in its word; so does U+19B0.
        assert_eq!(
            words("q\u{307}x n \u{19b0}"),
            ["q\u{307}x", "n", "\u{19b0}"]
        );
        assert_eq!(index_text("Grün, grün!"), "grün grün");
    }
}
