//! The web kit: what the gateway's two browser doors, the admin page (`admin`) and the pairing
//! page (`pairing::page`), build their HTML from. Every page is a `maud` template, so a value
//! spliced into one is escaped unless the kit marks markup it made itself; the kit holds the
//! pieces both doors share (the document shell, the notices, the plain-HTTP warning, the CSRF
//! field, long values that wrap between groups) and the headers both send.
//!
//! A leaf: it imports nothing of the crate, so any door may use it.

mod form;
mod layout;
mod text;

pub use form::{csrf_field, options};
pub use layout::{document, notice, plain_warning, Assets, Tone};
pub use text::{escape, tokens};

use hyper::header::{self, HeaderValue};

/// How a request reached the box: what a page may show, and whether its cookies must be
/// `Secure`. Decided once by the front door, from the transport the request came over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Over TLS.
    Encrypted,
    /// Over plain HTTP: anyone on the network can read it.
    Plain,
}

impl Channel {
    pub fn is_encrypted(self) -> bool {
        self == Channel::Encrypted
    }
}

/// The headers every page the gateway serves to a browser carries (the pairing page and the
/// admin page): its type and policy, never cached (pages hold codes and tokens), not sniffed,
/// not framed, no referrer, one request per connection.
pub fn guard_headers(h: &mut hyper::HeaderMap, content_type: &'static str, csp: HeaderValue) {
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::CONTENT_SECURITY_POLICY, csp);
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The source lines (`file:line: text`) under `src/<dirs>` that `found` picks, but those of
    /// the files under `src/<except>`.
    fn source_lines(dirs: &[&str], except: &str, found: impl Fn(&str) -> bool) -> Vec<String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for dir in dirs {
            rust_files(&src.join(dir), &mut files);
        }
        let mut lines = Vec::new();
        for file in files.iter().filter(|f| !f.starts_with(src.join(except))) {
            let text = std::fs::read_to_string(file).unwrap();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| found(l)) {
                lines.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
        lines
    }

    /// A page's raw markup is the kit's own, or the QR code's SVG (its renderer draws it from
    /// the pairing URI): any other `PreEscaped` outside the kit is a splice that escapes nothing.
    #[test]
    fn raw_markup_is_only_the_kit_s_and_the_qr_code_s() {
        let raw = source_lines(&[""], "web", |line| {
            line.contains("PreEscaped(") && !line.contains(".svg_qr(")
        });
        assert!(
            raw.is_empty(),
            "raw markup outside the kit:\n{}",
            raw.join("\n")
        );
    }

    /// How a request came is a [`super::Channel`], or the admin's request context, which keeps
    /// it as its one flag: no page, handler or cookie of a browser door takes a `secure` flag.
    #[test]
    fn the_browser_doors_take_a_channel_not_a_secure_flag() {
        let doors = ["admin", "pairing", "web", "front"];
        let flags = source_lines(&doors, "admin/context.rs", |line| {
            // Spelled in two pieces, so this line is not one it finds.
            line.contains(concat!("secure", ": bool"))
        });
        assert!(flags.is_empty(), "a secure flag:\n{}", flags.join("\n"));
    }
}
