//! The rule a new passphrase (the owner's, the backups') must pass, after NIST SP 800-63B
//! §5.1.1.2: long enough ([`MIN_PASSPHRASE_CHARS`]) and not too long
//! ([`MAX_PASSPHRASE_BYTES`]), counted after Unicode NFKC normalisation, and none of what a
//! guesser tries first: a common or leaked password (with or without digits and signs around
//! it or l33t spellings), repeats, sequences and keyboard rows, or the box's own names.
//!
//! It replaced the zxcvbn estimator, which cost 2.5 MB of binary and kept ~7 MB of tables in
//! memory after its first use, and whose cost grew faster than the length. The rule reads a
//! passphrase a few times over and binary-searches a list of a few thousand entries in place:
//! its cost is linear in a length bounded by `MAX_PASSPHRASE_BYTES` (normalised too), 2-4 ms
//! for the longest in an unoptimised debug build on a loaded 2-core x86 machine: it needs no
//! budget of its own, only a pooled blocking thread (`strength.rs`, docs/security.md).

use unicode_normalization::UnicodeNormalization;
use zeroize::Zeroizing;

/// Shortest passphrase accepted, in characters once normalised.
pub const MIN_PASSPHRASE_CHARS: usize = 12;
/// Longest passphrase accepted, in bytes as typed and once normalised: far beyond any person's
/// (NIST asks for at least 64 characters), short enough to hash and check fast.
pub const MAX_PASSPHRASE_BYTES: usize = 1024;
/// The most common passwords of leaked corpora, lowercase, sorted by byte, one a line after a
/// header of `#` lines saying where they come from.
const COMMON_PASSWORDS: &str = include_str!("common_passwords.txt");
/// Fewest different characters a passphrase may have: "aaaaaaaaaaab" and "abababababab" are
/// repeats whatever their length.
pub const MIN_DISTINCT_CHARS: usize = 5;
/// Counted characters from which the meter says "Strong." (from the minimum it says "Good
/// enough."): past twenty, length is what a guesser cannot make up for.
pub const STRONG_CHARS: usize = 20;
/// Shortest word of a host or device name taken as one of the box's own words: shorter ones
/// ("pi", "my") are parts of too many good passphrases.
pub const MIN_OWN_WORD_CHARS: usize = 4;
/// The box's names, always its own words.
const BOX_WORDS: [&str; 3] = ["iris", "gateway", "hermes"];
/// Rows of a keyboard: neighbours on one are a sequence, as "abc" and "123" are.
const KEYBOARD_ROWS: [&str; 4] = ["1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm"];
/// Digits and signs read as letters ("p@ssw0rd"), each with the letter it stands for.
const L33T: [(char, char); 9] = [
    ('4', 'a'),
    ('@', 'a'),
    ('3', 'e'),
    ('1', 'i'),
    ('!', 'i'),
    ('0', 'o'),
    ('$', 's'),
    ('5', 's'),
    ('7', 't'),
];

/// Why a passphrase is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// More than `MAX_PASSPHRASE_BYTES` as typed.
    TooLong,
    /// Fewer than `MIN_PASSPHRASE_CHARS` characters once normalised: it has `chars`.
    TooShort { chars: usize },
    /// Long enough, but what a guesser tries first.
    Weak(Weakness),
}

/// What a guesser would try first, which a long enough passphrase may still be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weakness {
    /// Without the box's own words it is shorter than the minimum.
    OwnWords,
    /// A few characters or one group of them, repeated.
    Repeats,
    /// Runs along the alphabet, the digits or a keyboard row.
    Sequence,
    /// On the list of common and leaked passwords (`common_passwords.txt`).
    Common,
}

impl Weakness {
    /// Why, for the owner: completes "this passphrase is too easy to guess (…)".
    pub fn why(self) -> &'static str {
        match self {
            Weakness::OwnWords => {
                "words naming this box or its devices, like iris, gateway or hermes, do not count, \
                 and without them it is too short"
            }
            Weakness::Repeats => "repeats like \"aaa\" or \"abab\" are tried early",
            Weakness::Sequence => {
                "sequences like \"abcd\", \"1234\" or keyboard rows like \"qwerty\" are tried early"
            }
            Weakness::Common => {
                "it is on a list of common and leaked passwords, even with digits or signs added"
            }
        }
    }
}

/// An accepted passphrase: the characters that counted (without the box's own words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub chars: usize,
}

impl Accepted {
    pub fn strong(self) -> bool {
        self.chars >= STRONG_CHARS
    }
}

/// The box's own words: its names, its host name and the words of `names` (its devices'), each
/// lowercase and normalised as a passphrase is.
pub fn own_words<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut words: Vec<String> = BOX_WORDS.iter().map(|w| (*w).to_owned()).collect();
    let mut add_words_of = |name: &str| {
        let folded = fold(name);
        words.extend(
            folded
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| w.chars().count() >= MIN_OWN_WORD_CHARS)
                .map(str::to_owned),
        );
    };
    if let Some(host) = crate::lan::hostname() {
        add_words_of(&host);
    }
    names.into_iter().for_each(add_words_of);
    words.sort();
    words.dedup();
    words
}

/// Checks a new passphrase against the rule, with the box's `own_words` ([`own_words`]).
pub fn check(passphrase: &str, own_words: &[String]) -> Result<Accepted, Fault> {
    // Checked as typed, before normalising: what normalising costs stays bounded.
    if passphrase.len() > MAX_PASSPHRASE_BYTES {
        return Err(Fault::TooLong);
    }
    let normal = normalised(passphrase).ok_or(Fault::TooLong)?;
    let chars = normal.chars().count();
    if chars < MIN_PASSPHRASE_CHARS {
        return Err(Fault::TooShort { chars });
    }
    let folded = Zeroizing::new(normal.to_lowercase());
    let rest = without_own_words(&folded, own_words);
    let rest = rest.as_deref().unwrap_or(&folded);
    let counted = rest.chars().count();
    if counted < MIN_PASSPHRASE_CHARS {
        return Err(Fault::Weak(Weakness::OwnWords));
    }
    let compact: Zeroizing<String> =
        Zeroizing::new(rest.chars().filter(|c| !is_separator(*c)).collect());
    if is_repeat(&compact) {
        return Err(Fault::Weak(Weakness::Repeats));
    }
    if is_sequence(&compact) {
        return Err(Fault::Weak(Weakness::Sequence));
    }
    if is_common(rest) {
        return Err(Fault::Weak(Weakness::Common));
    }
    Ok(Accepted { chars: counted })
}

/// The NFKC form of `passphrase`, or `None` once it passes `MAX_PASSPHRASE_BYTES`: normalising
/// can make one character eighteen ("ﷺ"), and every check after it must stay bounded.
fn normalised(passphrase: &str) -> Option<Zeroizing<String>> {
    // Room for the most accepted up front: a reallocation would leave a copy behind unzeroed.
    let mut out = Zeroizing::new(String::with_capacity(MAX_PASSPHRASE_BYTES + 4));
    for c in passphrase.nfkc() {
        out.push(c);
        if out.len() > MAX_PASSPHRASE_BYTES {
            return None;
        }
    }
    Some(out)
}

/// Lowercase NFKC, as every passphrase and word is compared.
fn fold(text: &str) -> String {
    text.nfkc().collect::<String>().to_lowercase()
}

/// Between words, not part of one: spaces and the signs people join words with.
fn is_separator(c: char) -> bool {
    c.is_whitespace() || matches!(c, '-' | '_' | '.' | ',' | ';' | ':' | '/' | '+' | '\'')
}

/// `folded` with each of the box's own words taken out and the spaces left closed up; `None`
/// if it has none of them (then every character counts, spaces too).
fn without_own_words(folded: &str, own_words: &[String]) -> Option<Zeroizing<String>> {
    if !own_words.iter().any(|w| folded.contains(w.as_str())) {
        return None;
    }
    let mut rest = Zeroizing::new(folded.to_owned());
    for word in own_words {
        // Into a space, not nothing: the parts on either side must not join into a new word.
        *rest = rest.replace(word.as_str(), " ");
    }
    Some(Zeroizing::new(
        rest.split_whitespace().collect::<Vec<_>>().join(" "),
    ))
}

/// Few different characters, or one group of them over and over ("hellohellohello").
fn is_repeat(compact: &str) -> bool {
    let chars: Vec<char> = compact.chars().collect();
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT_CHARS {
        return true;
    }
    (1..=chars.len() / 2)
        .filter(|unit| chars.len().is_multiple_of(*unit))
        .any(|unit| chars.chunks(unit).all(|c| c == &chars[..unit]))
}

/// Made of runs of at least three neighbours (the same character, the next or previous letter or
/// digit, or a neighbour on a keyboard row): "abcdef123456", "qwertyasdfgh", "zyxw9876".
fn is_sequence(compact: &str) -> bool {
    let chars: Vec<char> = compact.chars().collect();
    let mut run = 1;
    for pair in chars.windows(2) {
        if neighbours(pair[0], pair[1]) {
            run += 1;
        } else if run < 3 {
            return false;
        } else {
            run = 1;
        }
    }
    run >= 3
}

fn neighbours(a: char, b: char) -> bool {
    if a == b {
        return true;
    }
    let steps = |x: char, y: char| (x as u32).abs_diff(y as u32) == 1;
    let same_kind = (a.is_ascii_lowercase() && b.is_ascii_lowercase())
        || (a.is_ascii_digit() && b.is_ascii_digit());
    if same_kind && steps(a, b) {
        return true;
    }
    KEYBOARD_ROWS.iter().any(|row| {
        let at = |c| row.find(c);
        matches!((at(a), at(b)), (Some(i), Some(j)) if i.abs_diff(j) == 1)
    })
}

/// On the list as it is, or once what a guesser adds is taken off: digits and signs at either
/// end ("password123!"), the spaces and signs between its words ("pass word"), l33t spellings
/// ("p@ssw0rd").
fn is_common(rest: &str) -> bool {
    if on_list(rest) {
        return true;
    }
    let core = rest.trim_matches(|c: char| !c.is_alphabetic());
    if core.is_empty() {
        return false;
    }
    if on_list(core) {
        return true;
    }
    let joined: Zeroizing<String> = Zeroizing::new(
        core.chars()
            .filter(|c| c.is_alphanumeric() || l33t_letter(*c).is_some())
            .collect(),
    );
    // "1" stands for "l" as often as for "i".
    on_list(&joined) || on_list(&unl33t(&joined, 'i')) || on_list(&unl33t(&joined, 'l'))
}

/// The letter a l33t digit or sign stands for.
fn l33t_letter(c: char) -> Option<char> {
    L33T.iter().find(|(l, _)| *l == c).map(|(_, p)| *p)
}

/// `text` with its l33t spellings read as letters, "1" as `one_as`.
fn unl33t(text: &str, one_as: char) -> Zeroizing<String> {
    Zeroizing::new(
        text.chars()
            .map(|c| match c {
                '1' => one_as,
                c => l33t_letter(c).unwrap_or(c),
            })
            .collect(),
    )
}

/// The list's entries, after its header.
fn entries() -> &'static str {
    let mut body = COMMON_PASSWORDS;
    while body.starts_with('#') {
        body = body.split_once('\n').map_or("", |(_, after)| after);
    }
    body
}

/// Binary search of the sorted list in place (no table built, nothing kept in memory).
fn on_list(candidate: &str) -> bool {
    let list = entries();
    let (mut lo, mut hi) = (0, list.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let start = list[lo..mid].rfind('\n').map_or(lo, |i| lo + i + 1);
        let end = list[start..].find('\n').map_or(list.len(), |i| start + i);
        match list[start..end].cmp(candidate) {
            std::cmp::Ordering::Equal => return true,
            std::cmp::Ordering::Less => lo = end + 1,
            std::cmp::Ordering::Greater => hi = start,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<String> {
        ["iris", "gateway", "hermes", "kitchen", "anna"]
            .map(str::to_owned)
            .to_vec()
    }

    fn fault(p: &str) -> Option<Fault> {
        check(p, &words()).err()
    }

    #[test]
    fn length_is_counted_in_normalised_characters_and_bounded_in_bytes() {
        assert_eq!(fault("short"), Some(Fault::TooShort { chars: 5 }));
        // Eleven characters of four bytes each: long in bytes, short in characters.
        let emoji = "🦀🐙🦊🐝🦉🐢🦜🐬🦒🐘🦔";
        assert_eq!(fault(emoji), Some(Fault::TooShort { chars: 11 }));
        // NFKC makes the ligature "ﬃ" three letters: ten characters typed, twelve counted.
        assert_eq!(
            check("ﬃolet trac", &words()).map(|a| a.chars),
            Ok(MIN_PASSPHRASE_CHARS)
        );
        assert_eq!(fault("ﬃole trac"), Some(Fault::TooShort { chars: 11 }));
        // Full-width letters are the same letters: "ｐａｓｓｗｏｒｄ" is "password".
        assert_eq!(
            fault("ｐａｓｓｗｏｒｄ１２３４"),
            Some(Fault::Weak(Weakness::Common))
        );
        let longest = "violet tractor harbour ".repeat(50);
        let longest = &longest[..MAX_PASSPHRASE_BYTES];
        assert_eq!(fault(longest), None);
        assert_eq!(fault(&format!("{longest}x")), Some(Fault::TooLong));
        // 1,023 bytes typed, eighteen times that normalised: too long, not checked further.
        assert_eq!(fault(&"ﷺ".repeat(341)), Some(Fault::TooLong));
    }

    #[test]
    fn each_weakness_is_refused_with_its_kind() {
        for (p, kind) in [
            ("aaaaaaaaaaaa", Weakness::Repeats),
            ("aaaaaaaaaaab", Weakness::Repeats),
            ("hello hello hello", Weakness::Repeats),
            ("abcdefghijklmn", Weakness::Sequence),
            ("123456789012", Weakness::Sequence),
            ("zyxwvu 987654", Weakness::Sequence),
            ("qwertyuiop asdfgh", Weakness::Sequence),
            ("abcdef-123456", Weakness::Sequence),
            ("password1234", Weakness::Common),
            ("Password123!", Weakness::Common),
            ("!!iloveyou2024", Weakness::Common),
            ("p@ssw0rd 1234", Weakness::Common),
            ("pass word 99 99", Weakness::Common),
            ("sunshine-1999", Weakness::Common),
            ("iris gateway 2024", Weakness::OwnWords),
            ("Hermes in the kitchen", Weakness::OwnWords),
            ("ANNA's gateway", Weakness::OwnWords),
        ] {
            assert_eq!(fault(p), Some(Fault::Weak(kind)), "{p}");
        }
    }

    #[test]
    fn good_passphrases_pass_and_long_ones_are_strong() {
        for p in [
            "violet tractor harbour 42",
            "correct horse battery",
            "4@8(3!1|0$5+7",
            "Grüße aus Köln am Rhein",
            "an iris in the violet tractor",
            "kitchen radio plays jazz at six",
        ] {
            assert_eq!(fault(p), None, "{p}");
        }
        assert!(check("violet tractor harbour 42", &words())
            .unwrap()
            .strong());
        assert!(!check("violet tract", &words()).unwrap().strong());
        // The box's own words do not count towards the length.
        assert_eq!(
            check("iris violet tractor", &words()).map(|a| a.chars),
            Ok("violet tractor".len())
        );
    }

    #[test]
    fn the_list_is_sorted_lowercase_and_its_boundaries_are_found() {
        let list: Vec<&str> = entries().lines().collect();
        assert!(list.len() > 3_000, "{}", list.len());
        assert!(
            list.windows(2).all(|w| w[0] < w[1]),
            "not sorted or not unique"
        );
        assert!(list.iter().all(|e| !e.is_empty() && fold(e) == *e));
        for e in &list {
            assert!(on_list(e), "{e} not found");
        }
        let (first, last) = (list[0], list[list.len() - 1]);
        assert!(!on_list(&first[..first.len() - 1]));
        assert!(!on_list(&format!("{last}z")));
        assert!(!on_list(""));
        assert!(!on_list("violet tractor harbour"));
        // The last entry, found as the core of a longer passphrase.
        assert_eq!(
            fault(&format!("{last} 2024!")),
            Some(Fault::Weak(Weakness::Common))
        );
    }

    #[test]
    fn own_words_come_from_the_names_given_and_keep_only_long_words() {
        let w = own_words(["Anna's Pixel 7", "pi"]);
        for expected in ["iris", "gateway", "hermes", "anna", "pixel"] {
            assert!(w.iter().any(|x| x == expected), "{expected} in {w:?}");
        }
        assert!(
            !w.iter().any(|x| x == "pi" || x == "7" || x == "s"),
            "{w:?}"
        );
    }
}
