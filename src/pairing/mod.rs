//! Pairing by QR code: the one URI a phone scans, and its renderings (terminal, SVG).
//!
//! The same URI is printed by `iris-gateway pair` as Unicode half blocks and shown by the
//! gateway's pairing page (`GET /pair`, see [`page`]) as inline SVG, so the app has one format
//! to parse wherever the code came from. The format is documented in docs/security.md
//! ("Pairing by QR code"):
//!
//! `iris://pair?url=<ws or wss URL>&token=<token>&fp=<64 hex digits>`
//!
//! each value percent-encoded; `fp` only when TLS is on, and then `url` is the `wss://` URL.

pub mod codes;
pub mod page;

use qrcode::render::{svg, unicode};
use qrcode::{EcLevel, QrCode};

use crate::tls::compact_fingerprint;

/// Scheme and path of the pairing URI, so the app can tell it from any other QR code.
pub const URI_PREFIX: &str = "iris://pair?";

/// What a phone needs to pair, as carried by the QR code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invitation {
    /// The URL to connect to: `wss://` when TLS is on (pin `fingerprint`), else `ws://`.
    pub url: String,
    pub token: String,
    /// SHA-256 of the certificate as 64 uppercase hex digits (no `:`), when TLS is on.
    pub fingerprint: Option<String>,
}

impl Invitation {
    /// From what `pair` reports: prefers the TLS URL (with its pin) whenever TLS is on, since a
    /// QR code shown on the box is exactly the trusted path a fingerprint needs.
    pub fn new(url: &str, token: &str, tls: Option<&crate::tls::Advert>) -> Invitation {
        match tls {
            Some(t) => Invitation {
                url: t.url.clone(),
                token: token.to_owned(),
                fingerprint: Some(compact_fingerprint(&t.fingerprint)),
            },
            None => Invitation {
                url: url.to_owned(),
                token: token.to_owned(),
                fingerprint: None,
            },
        }
    }

    /// The pairing URI: the one string the QR code encodes.
    pub fn uri(&self) -> String {
        let mut uri = format!(
            "{URI_PREFIX}url={}&token={}",
            percent_encode(&self.url),
            percent_encode(&self.token)
        );
        if let Some(fp) = &self.fingerprint {
            uri.push_str("&fp=");
            uri.push_str(&percent_encode(fp));
        }
        uri
    }

    /// The QR code of [`Invitation::uri`].
    fn qr(&self) -> QrCode {
        // Medium error correction: a token URI fits in a version ~8 code (49 modules), small
        // enough for a terminal yet tolerant of a smudged or glaring screen.
        QrCode::with_error_correction_level(self.uri().as_bytes(), EcLevel::M)
            .expect("a pairing URI is far below a QR code's capacity")
    }

    /// The QR code as text for a terminal: two modules per character (Unicode half blocks),
    /// with the quiet zone. Light modules are drawn as blocks, so on the usual dark terminal
    /// the code appears dark on light, the way scanners expect it.
    pub fn terminal_qr(&self) -> String {
        self.qr()
            .render::<unicode::Dense1x2>()
            .dark_color(unicode::Dense1x2::Light)
            .light_color(unicode::Dense1x2::Dark)
            .quiet_zone(true)
            .build()
    }

    /// The QR code as an SVG element for inline use in HTML (no XML prolog), `px` wide.
    pub fn svg_qr(&self, px: u32) -> String {
        let image = self
            .qr()
            .render::<svg::Color>()
            .min_dimensions(px, px)
            .dark_color(svg::Color("#000"))
            .light_color(svg::Color("#fff"))
            .quiet_zone(true)
            .build();
        match image.find("<svg") {
            Some(start) => image[start..].to_owned(),
            None => image,
        }
    }
}

/// RFC 3986 percent-encoding of everything but the unreserved characters, so a value can never
/// be mistaken for a separator whatever it holds.
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_encodes_every_separator_and_carries_the_pin_only_with_tls() {
        let plain = Invitation::new("ws://192.168.1.20:8765", "iris_a-b_c", None);
        assert_eq!(
            plain.uri(),
            "iris://pair?url=ws%3A%2F%2F192.168.1.20%3A8765&token=iris_a-b_c"
        );
        let advert = crate::tls::Advert {
            url: "wss://[fd00::2]:8765".into(),
            fingerprint: "72:0a:94".into(),
            allow_plain: true,
        };
        let tls = Invitation::new("ws://[fd00::2]:8765", "t&x=y", Some(&advert));
        assert_eq!(
            tls.uri(),
            "iris://pair?url=wss%3A%2F%2F%5Bfd00%3A%3A2%5D%3A8765&token=t%26x%3Dy&fp=720A94"
        );
    }

    #[test]
    fn terminal_qr_is_half_blocks_with_a_light_quiet_zone() {
        let qr = Invitation::new("ws://10.0.0.1:8765", "iris_x", None).terminal_qr();
        let first = qr.lines().next().expect("a line");
        assert!(first.chars().all(|c| c == '\u{2588}'), "{first:?}");
        assert!(qr
            .chars()
            .all(|c| matches!(c, ' ' | '\u{2580}' | '\u{2584}' | '\u{2588}' | '\n')));
    }
}
