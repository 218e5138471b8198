//! The document shell and what a page says at its top: a notice, the plain-HTTP warning.

use maud::{html, Markup, DOCTYPE};

/// Where a page's style (and script) come from. The admin page links its own files, so its CSP
/// forbids every inline script and style; the pairing page has one inline style, allowed by
/// its hash.
pub enum Assets<'a> {
    Linked {
        stylesheet: &'a str,
        script: &'a str,
    },
    /// A style written in the source (never a value from a request): its CSP names its hash,
    /// so it must reach the page byte for byte (a style with `&`, `<`, `>` or `"` would not).
    Inline(&'static str),
}

/// A whole page: the doctype, the head both doors share (no referrer, a phone's width) and
/// `body`.
pub fn document(title: &str, assets: Assets, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) }
                @match assets {
                    Assets::Linked { stylesheet, script } => {
                        link rel="stylesheet" href=(stylesheet);
                        script src=(script) defer {}
                    }
                    Assets::Inline(style) => style { (style) },
                }
            }
            body { (body) }
        }
    }
}

/// How a notice reads: done, done with something to know, or not done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Good,
    Warn,
    Bad,
}

/// A notice at the top of a page (`#notice`): a status, or an alert when something failed.
pub fn notice(tone: Tone, text: &str) -> Markup {
    let (class, role) = match tone {
        Tone::Good => ("good", "status"),
        Tone::Warn => ("warn", "status"),
        Tone::Bad => ("bad", "alert"),
    };
    html! { p class=(class) role=(role) id="notice" { (text) } }
}

/// Said on a page that came over plain HTTP: what anyone on the network could read of it
/// (`exposed`), and where to go instead (`better`, after the sentence).
pub fn plain_warning(id: Option<&str>, exposed: &str, better: Markup) -> Markup {
    html! {
        p.warn id=[id] {
            "This page came over plain HTTP: anyone on your network could read " (exposed) "."
            (better)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_style_reaches_the_page_byte_for_byte() {
        const STYLE: &str = "a{color:red}.b c{margin:0 'x'}";
        let page = document("t", Assets::Inline(STYLE), html! {}).into_string();
        assert!(page.contains(&format!("<style>{STYLE}</style>")), "{page}");
    }

    #[test]
    fn values_in_the_shell_are_escaped() {
        let page = document(
            "<b>",
            Assets::Linked {
                stylesheet: "/s\"",
                script: "/j",
            },
            notice(Tone::Bad, "<script>"),
        )
        .into_string();
        assert!(page.contains("<title>&lt;b&gt;</title>"), "{page}");
        assert!(page.contains("href=\"/s&quot;\""), "{page}");
        assert!(page.contains("&lt;script&gt;</p>"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
    }
}
