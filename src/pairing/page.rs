//! The pairing page, `/pair` on the gateway's port: a form asking for the one-time code the
//! gateway prints (see [`super::codes`]), answered with the pairing QR code and the URL,
//! fingerprint and token in text.
//!
//! The code goes in a POST body, so it does not sit in the address bar, the history or a
//! proxy's log. The token is minted only once a valid code is presented, so nothing that
//! merely reads the journal or the page's URL can pair. Every answer is `Cache-Control:
//! no-store` and carries a Content-Security-Policy that allows nothing but the page's own
//! inline style: no scripts, no external resources, no framing, forms posting only here.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use maud::{html, Markup, PreEscaped};

use super::codes::{PageCodes, Refusal};
use super::Invitation;
use crate::hub::Hub;
use crate::web::{self, Assets, Channel};

/// The path the page is served at.
pub const PATH: &str = "/pair";
/// Largest form body read: a code is 9 characters and a name at most `limits.max_name_chars`
/// (100) characters, each at most 12 bytes percent-encoded, so anything past this is not a form
/// of ours.
const MAX_FORM_BYTES: usize = 2048;
/// Side of the QR code on the page, in CSS pixels: big enough to scan from a laptop screen.
const QR_PX: u32 = 320;

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;\
padding:0 1rem;color:#111;background:#fff}code,input{font-family:ui-monospace,monospace}\
.token{white-space:nowrap}input{font-size:1.5rem;width:10ch;letter-spacing:.1em}input.name{width:min(100%,20ch);letter-spacing:0}\
button{font-size:1.2rem}.warn{background:#fff3cd;padding:.5rem}\
.qr svg{width:320px;height:320px}";

/// What the page needs beyond the hub: the codes, and what to put in the QR code.
pub struct PairingPage {
    pub codes: PageCodes,
    /// The plain URL `pair` reports (`ws://…`, or `wss://…` when plain is refused).
    url: String,
    tls: Option<crate::tls::Advert>,
}

impl PairingPage {
    pub fn new(codes: PageCodes, url: String, tls: Option<crate::tls::Advert>) -> PairingPage {
        PairingPage { codes, url, tls }
    }

    /// Where a person opens the page: `https://` when TLS is on (the token then crosses the
    /// LAN encrypted), else `http://`, on the address `pair` shows.
    pub fn address(&self) -> String {
        let base = match &self.tls {
            Some(t) => t.url.replacen("wss://", "https://", 1),
            None => self.url.replacen("ws://", "http://", 1),
        };
        format!("{base}{PATH}")
    }
}

/// What the front door learns of a request for the page once: who sent it, and over what.
#[derive(Clone, Copy, Debug)]
pub struct Visit {
    peer: SocketAddr,
    channel: Channel,
}

impl Visit {
    pub fn new(peer: SocketAddr, channel: Channel) -> Visit {
        Visit { peer, channel }
    }
}

/// Serves one request for [`PATH`].
pub async fn serve(
    page: &PairingPage,
    hub: &Hub,
    req: Request<Incoming>,
    visit: Visit,
) -> Response<Full<Bytes>> {
    match *req.method() {
        Method::GET | Method::HEAD => html(
            StatusCode::OK,
            form_page(None, hub.limits().max_name_chars, visit.channel),
        ),
        Method::POST => redeem(page, hub, req, visit).await,
        _ => {
            let mut reply = html(
                StatusCode::METHOD_NOT_ALLOWED,
                message_page("Not here", "The pairing page takes GET and POST."),
            );
            reply
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
            reply
        }
    }
}

async fn redeem(
    page: &PairingPage,
    hub: &Hub,
    req: Request<Incoming>,
    visit: Visit,
) -> Response<Full<Bytes>> {
    let Visit { peer, channel } = visit;
    let body = match Limited::new(req.into_body(), MAX_FORM_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return html(
                StatusCode::PAYLOAD_TOO_LARGE,
                message_page("Too large", "That form is not one of this page's."),
            )
        }
    };
    let Some(code) = form_value(&body, "code") else {
        return html(
            StatusCode::BAD_REQUEST,
            form_page(
                Some("Enter the code the gateway printed."),
                hub.limits().max_name_chars,
                channel,
            ),
        );
    };
    // The page asks for a name; one left out (an older page, a script) stays empty until the
    // app's hello names the device, as before.
    let name: String = form_value(&body, "name")
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let name = name.trim();
    let max = hub.limits().max_name_chars;
    if name.chars().count() > max {
        return html(
            StatusCode::BAD_REQUEST,
            form_page(
                Some(&format!(
                    "That name is longer than {max} characters: give the phone a shorter one."
                )),
                max,
                channel,
            ),
        );
    }
    match page.codes.redeem(&code, peer.ip()) {
        Ok(()) => {}
        Err(refusal) => {
            info!(%peer, ?refusal, "pairing page: code refused");
            return refused(refusal, hub.limits().max_name_chars, channel);
        }
    }
    let token = match hub.devices().pair(name).await {
        Ok((device, token)) => {
            info!(%peer, device = %device.device_id, "pairing page: paired a device");
            token
        }
        Err(e) => {
            warn!("pairing page: could not pair: {e}");
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                message_page(
                    "Could not pair",
                    &format!(
                        "The gateway could not store the new device ({e}). The code is used \
                         up: get a new one with {}.",
                        crate::hints::command("pair --page")
                    ),
                ),
            );
        }
    };
    let invitation = Invitation::new(&page.url, &token, page.tls.as_ref());
    html(StatusCode::OK, qr_page(&invitation, page, channel))
}

fn refused(refusal: Refusal, max_name: usize, channel: Channel) -> Response<Full<Bytes>> {
    match refusal {
        Refusal::Wrong => html(
            StatusCode::FORBIDDEN,
            form_page(
                Some("That code is not right. Check it against what the gateway printed."),
                max_name,
                channel,
            ),
        ),
        Refusal::Spent => html(
            StatusCode::GONE,
            message_page(
                "Code used up",
                &format!(
                    "That code was already used, has expired, or was replaced by a newer one. \
                     Get a new one on the gateway with: {}",
                    crate::hints::command("pair --page")
                ),
            ),
        ),
        Refusal::RateLimited {
            retry_after_secs,
            shared,
        } => {
            let whose = if shared {
                "from too many addresses at once"
            } else {
                "from this address"
            };
            let mut reply = html(
                StatusCode::TOO_MANY_REQUESTS,
                message_page(
                    "Too many tries",
                    &format!(
                        "Too many wrong codes {whose} \
                         (limits.pair_code_failures_per_minute). Try again in \
                         {retry_after_secs} s."
                    ),
                ),
            );
            reply
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            reply
        }
    }
}

/// The value of `key` in an `application/x-www-form-urlencoded` body.
fn form_value(body: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

/// Form decoding: `+` is a space, `%XX` a byte; a broken escape is kept as typed.
pub(crate) fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|d| d as u8)
}

fn document(title: &str, body: Markup) -> Markup {
    web::document(title, Assets::Inline(STYLE), body)
}

/// Said on every page that came over plain HTTP: the token would cross the LAN in clear.
fn plain_warning(channel: Channel) -> Markup {
    if channel.is_encrypted() {
        return html! {};
    }
    web::plain_warning(
        None,
        "the token it shows",
        html! { " Prefer the " code { "https://" } " address the gateway printed." },
    )
}

/// The form: the code, and a name of at most `max_name` characters (`limits.max_name_chars`).
fn form_page(problem: Option<&str>, max_name: usize, channel: Channel) -> Markup {
    document(
        "Pair a phone with Iris",
        html! {
            h1 { "Pair a phone with Iris" }
            @if let Some(problem) = problem {
                p.warn role="alert" { (problem) }
            }
            (plain_warning(channel))
            form method="post" action=(PATH) {
                p { label for="code" { "The code the gateway printed (or "
                    code { (crate::hints::command("pair --page")) } " shows):" } }
                p { input id="code" name="code" autocomplete="off" autocapitalize="characters"
                    spellcheck="false" maxlength="16" required autofocus; }
                p { label for="name" { "A name for this phone (to tell it apart on the admin \
                    page's Devices):" } }
                p { input id="name" name="name" class="name" autocomplete="off"
                    maxlength=(max_name) placeholder="e.g. Anna's phone" required; }
                p { button type="submit" { "Show the QR code" } }
            }
        },
    )
}

fn qr_page(invitation: &Invitation, page: &PairingPage, channel: Channel) -> Markup {
    document(
        "Iris pairing code",
        html! {
            h1 { "Scan this with the Iris app" }
            (plain_warning(channel))
            // The QR code's own renderer made this SVG from the pairing URI: markup of ours,
            // no text of anyone's in it.
            div.qr { (PreEscaped(invitation.svg_qr(QR_PX))) }
            dl {
                dt { "URL" } dd { code { (web::tokens(&invitation.url)) } }
                @if let Some(t) = &page.tls {
                    dt { "Certificate SHA-256 (pin it)" } dd { code { (web::tokens(&t.fingerprint)) } }
                }
                dt { "Token (shown only now)" } dd { code { (web::tokens(&invitation.token)) } }
            }
            p { "This page is not kept: close it once the phone is paired. The device can be \
                revoked with " code { (crate::hints::command("devices revoke DEVICE")) } "." }
        },
    )
}

fn message_page(title: &str, text: &str) -> Markup {
    document(title, html! { h1 { (title) } p { (text) } })
}

/// `'sha256-…'` of the page's only inline style, the one thing its CSP allows.
fn style_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        let digest = Sha256::digest(STYLE.as_bytes());
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        )
    })
}

fn html(status: StatusCode, body: Markup) -> Response<Full<Bytes>> {
    let mut reply = Response::new(Full::new(Bytes::from(body.into_string())));
    *reply.status_mut() = status;
    let csp = format!(
        "default-src 'none'; style-src {}; img-src 'none'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
        style_hash()
    );
    let csp = HeaderValue::from_str(&csp).unwrap_or(HeaderValue::from_static("default-src 'none'"));
    web::guard_headers(reply.headers_mut(), "text/html; charset=utf-8", csp);
    reply
}

/// How long a fresh code lasts, in whole minutes for people (at least 1).
pub fn ttl_minutes(ttl: Duration) -> u64 {
    ttl.as_secs().div_ceil(60).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_decoded() {
        assert_eq!(
            form_value(b"x=1&code=ab%2Dcd+ef", "code").as_deref(),
            Some("ab-cd ef")
        );
        assert_eq!(form_value(b"code=%zz%4", "code").as_deref(), Some("%zz%4"));
        assert_eq!(form_value(b"other=1", "code"), None);
    }
}
