//! What every admin answer is made of: the body type, the refusals and their statuses, the
//! guarding headers (CSP, no-store, no framing), pages, redirects and cookies.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use maud::Markup;

use super::context::{Ctx, SignedIn};
use super::pages::{self, Notice};
use super::route::{Route, PREFIX, STATIC_PREFIX};
use super::{session, Admin};

/// The page's only stylesheet and script, embedded: nothing is loaded from outside the box.
pub(super) const CSS: &str = include_str!("assets/admin.css");
pub(super) const JS: &str = include_str!("assets/admin.js");

/// A whole answer (most pages).
pub(super) type Reply = Response<Full<Bytes>>;
/// Every answer's body: whole pages, or a backup streamed as it is made.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// A whole answer as a [`Body`].
pub(super) fn whole(reply: Reply) -> Response<Body> {
    reply.map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// Why a request could not be served; each maps to a status and a page.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    #[error("sign in first")]
    NoSession,
    #[error("this form is stale or came from another site; reload the page and try again")]
    BadCsrf,
    #[error("that was larger than the gateway accepts; nothing was done")]
    TooLarge,
    #[error("{0}")]
    BadInput(String),
    #[error("there is no page at this address")]
    NotFound,
    #[error("{0}")]
    Unavailable(String),
    /// Something else of its kind is under way (a second restore upload).
    #[error("{0}")]
    Conflict(String),
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NoSession => StatusCode::UNAUTHORIZED,
            Refusal::BadCsrf => StatusCode::FORBIDDEN,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BadInput(_) => StatusCode::BAD_REQUEST,
            Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Conflict(_) => StatusCode::CONFLICT,
        }
    }
}

/// The set-up page, with a fresh token the gateway signed (`session::SetupTokens`) in its
/// cookie and its form.
pub(super) fn setup_page(admin: &Admin, status: StatusCode, n: &Notice, ctx: Ctx) -> Reply {
    let pre = admin.setup_tokens.issue();
    let mut reply = page(
        admin,
        status,
        "Set up this gateway",
        "",
        None,
        ctx,
        pages::setup(&pre, n),
    );
    set_cookies(&mut reply, &[ctx.cookie(session::PRE_COOKIE, &pre)]);
    reply
}

/// The sign-in page, with a fresh double-submit token in its cookie and its form; `next` is
/// where a right passphrase leads.
pub(super) fn signin_page(
    admin: &Admin,
    status: StatusCode,
    next: &str,
    n: &Notice,
    ctx: Ctx,
) -> Reply {
    let pre = session::random_token();
    let mut reply = page(
        admin,
        status,
        "Sign in",
        "",
        None,
        ctx,
        pages::signin(&pre, safe_next(next).unwrap_or(PREFIX), n),
    );
    set_cookies(&mut reply, &[ctx.cookie(session::PRE_COOKIE, &pre)]);
    reply
}

/// The page for a refusal, with its status.
pub(super) fn refused(admin: &Admin, r: Refusal, ctx: Ctx) -> Reply {
    refused_page(admin, r, None, ctx)
}

/// The page for a refusal: its one sentence and a way back; with `csrf` (signed in) in the
/// page with its navigation.
pub(super) fn refused_page(admin: &Admin, r: Refusal, csrf: Option<&str>, ctx: Ctx) -> Reply {
    let (title, back) = match (&r, csrf) {
        (Refusal::NoSession, _) => ("Signed out", "Sign in"),
        (Refusal::NotFound, _) => ("Page not found", "Back to the start page"),
        (_, Some(_)) => ("Not done", "Back to the start page"),
        (_, None) => ("Not done", "Back to the start"),
    };
    let body = pages::refusal(&sentence(&r.to_string()), (PREFIX, back));
    page(admin, r.status(), title, "", csrf, ctx, body)
}

/// A message as one sentence: capital first, a full stop last, and the system's own wording
/// of a failed file or network call put as the owner would say it (`words::owner_words`).
pub(super) fn sentence(text: &str) -> String {
    let text = super::words::owner_words(text);
    let mut chars = text.trim().chars();
    let Some(first) = chars.next() else {
        return String::new();
    };
    let mut s: String = first.to_uppercase().chain(chars).collect();
    if !s.ends_with(['.', '!', '?']) {
        s.push('.');
    }
    s
}

/// Where sign-in may lead: an admin page of this box, never elsewhere (no open redirect).
/// Only a path of plain characters under [`PREFIX`], not a static file or a one-time result.
pub(super) fn safe_next(next: &str) -> Option<&str> {
    let plain = next
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-_".contains(&b));
    (plain
        && next.len() <= 64
        && next.starts_with(PREFIX)
        && !next.contains("//")
        && !next.starts_with(STATIC_PREFIX)
        && Route::parse(next) != Some(Route::Paired))
    .then_some(next)
}

/// A JSON answer with the guarding headers.
pub(super) fn json(status: StatusCode, value: &serde_json::Value) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(value.to_string())));
    *reply.status_mut() = status;
    guard(&mut reply, "application/json");
    reply
}

/// A whole page with the headers every admin answer carries.
pub(super) fn page(
    admin: &Admin,
    status: StatusCode,
    title: &str,
    current: &str,
    csrf: Option<&str>,
    ctx: Ctx,
    body: Markup,
) -> Reply {
    let html = pages::document(title, current, csrf, &admin.shell(ctx), body);
    let mut reply = Response::new(Full::new(Bytes::from(html.into_string())));
    *reply.status_mut() = status;
    guard(&mut reply, "text/html; charset=utf-8");
    reply
}

/// A page of the signed-in owner's: with the navigation, its sign-out form and `current`
/// marked in the menu.
pub(super) fn signed_page(
    admin: &Admin,
    who: &SignedIn,
    status: StatusCode,
    title: &str,
    current: &Route,
    body: Markup,
) -> Reply {
    page(
        admin,
        status,
        title,
        &current.path(),
        Some(who.csrf()),
        who.ctx(),
        body,
    )
}

/// Headers every admin answer carries.
pub(super) fn guard(reply: &mut Reply, content_type: &'static str) {
    crate::web::guard_headers(
        reply.headers_mut(),
        content_type,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
}

/// The embedded stylesheet or script.
pub(super) fn asset(content_type: &'static str, body: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    guard(&mut reply, content_type);
    reply
}

/// `303 See Other` to an admin path (after a POST, or to sign in). `to` is built by the
/// gateway from plain characters; one that is not a header value leads to the start page.
pub(super) fn redirect(to: &str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = StatusCode::SEE_OTHER;
    guard(&mut reply, "text/plain; charset=utf-8");
    let to = HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static(PREFIX));
    reply.headers_mut().insert(header::LOCATION, to);
    reply
}

/// `303 See Other` to a route's page.
pub(super) fn redirect_to(route: &Route) -> Reply {
    redirect(&route.path())
}

/// Adds `Set-Cookie` headers (one per cookie, as browsers need them).
pub(super) fn set_cookies(reply: &mut Reply, cookies: &[String]) {
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(c) {
            reply.headers_mut().append(header::SET_COOKIE, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_leads_only_to_this_box_s_pages() {
        assert_eq!(safe_next("/admin/devices"), Some("/admin/devices"));
        assert_eq!(safe_next("/admin/"), Some("/admin/"));
        for bad in [
            "https://evil.example/admin/",
            "//evil.example/admin/",
            "/admin//evil.example",
            "/admin/../etc",
            "/admin/devices?x=1",
            "/admin\\evil",
            "/admin/static/admin.js",
            "/admin/paired",
            "/elsewhere",
            "",
        ] {
            assert_eq!(safe_next(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_refusal_reads_as_one_sentence() {
        assert_eq!(sentence("there is no page"), "There is no page.");
        assert_eq!(sentence("Saved."), "Saved.");
    }
}
