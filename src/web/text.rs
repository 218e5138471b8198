//! Text as HTML outside a template's own splices: a long value that may wrap only between its
//! groups, and the one escape left for HTML built as a string.

use maud::{html, Markup};

/// Text for HTML made outside a template (a page not yet a template); a template escapes by
/// itself. Quotes of both kinds are escaped, so it is safe in any quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The longest run of characters a long value (a fingerprint, a URL, a token, an id) keeps on
/// one line: short enough for a 360 px phone in the monospace font.
pub(super) const TOKEN_GROUP_CHARS: usize = 24;

/// A long value that wraps only between its groups, never inside one: it is cut after its
/// separators (`:` between a fingerprint's bytes, `/` in a URL, `-`, spaces) into groups of at
/// most [`TOKEN_GROUP_CHARS`], each a `nowrap` `<span class="token">`, with a `<wbr>` between
/// them (which copies as nothing: the value is copied whole).
pub fn tokens(text: &str) -> Markup {
    let groups = groups(text);
    html! {
        @for (i, group) in groups.iter().enumerate() {
            @if i > 0 { wbr; }
            span.token { (group) }
        }
    }
}

fn groups(text: &str) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    let mut piece = String::new();
    for c in text.chars() {
        piece.push(c);
        if matches!(c, ':' | '/' | '-' | ' ') {
            pieces.push(std::mem::take(&mut piece));
        }
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    let mut groups: Vec<String> = Vec::new();
    let mut group = String::new();
    for piece in pieces {
        if group.chars().count() + piece.chars().count() > TOKEN_GROUP_CHARS && !group.is_empty() {
            groups.push(std::mem::take(&mut group));
        }
        group.push_str(&piece);
        // A piece with no separator for longer than a group (a token, a hash) is cut evenly.
        while group.chars().count() > TOKEN_GROUP_CHARS {
            let cut = group
                .char_indices()
                .nth(TOKEN_GROUP_CHARS)
                .map_or(group.len(), |(i, _)| i);
            let rest = group.split_off(cut);
            groups.push(std::mem::replace(&mut group, rest));
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("<a href='x'>&"), "&lt;a href=&#39;x&#39;&gt;&amp;");
    }

    #[test]
    fn long_values_wrap_between_groups_only() {
        let fp = (0..32)
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":");
        let html = tokens(&fp).into_string();
        let groups: Vec<&str> = html
            .split("<wbr>")
            .map(|g| {
                g.trim_start_matches("<span class=\"token\">")
                    .trim_end_matches("</span>")
            })
            .collect();
        // Whole bytes only: each group ends after a colon, but the last.
        assert_eq!(groups.concat(), fp);
        assert!(
            groups.iter().all(|g| g.len() <= TOKEN_GROUP_CHARS),
            "{groups:?}"
        );
        assert!(groups[..groups.len() - 1].iter().all(|g| g.ends_with(':')));
        assert_eq!(
            tokens("a<b").into_string(),
            "<span class=\"token\">a&lt;b</span>"
        );
        let long = "x".repeat(50);
        assert_eq!(tokens(&long).into_string().matches("<wbr>").count(), 2);
    }
}
