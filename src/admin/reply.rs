//! What every admin answer is made of: the body type, the refusals and their statuses, the
//! guarding headers (CSP, no-store, no framing), pages, redirects and cookies.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::pages::{self, Notice};
use super::{session, Admin, PREFIX};

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
    #[error("too large: a form is at most limits.admin_max_form_bytes, a restore upload at most limits.media_quota_bytes plus 1 GiB")]
    TooLarge,
    #[error("{0}")]
    BadInput(String),
    #[error("not found")]
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

/// The set-up page, with a fresh double-submit token in its cookie and its form.
pub(super) fn setup_page(admin: &Admin, status: StatusCode, n: &Notice, secure: bool) -> Reply {
    let pre = session::random_token();
    let mut reply = page(
        admin,
        status,
        "Set up this gateway",
        "",
        None,
        secure,
        &pages::setup(&pre, n),
    );
    set_cookies(
        &mut reply,
        &[session::set_cookie(session::PRE_COOKIE, &pre, secure)],
    );
    reply
}

/// The sign-in page, with a fresh double-submit token in its cookie and its form.
pub(super) fn signin_page(admin: &Admin, status: StatusCode, n: &Notice, secure: bool) -> Reply {
    let pre = session::random_token();
    let mut reply = page(
        admin,
        status,
        "Sign in",
        "",
        None,
        secure,
        &pages::signin(&pre, n),
    );
    set_cookies(
        &mut reply,
        &[session::set_cookie(session::PRE_COOKIE, &pre, secure)],
    );
    reply
}

/// The page for a refusal, with its status.
pub(super) fn refused(admin: &Admin, r: Refusal, secure: bool) -> Reply {
    let status = r.status();
    let text = r.to_string();
    let body = match r {
        Refusal::NoSession => format!(
            "{}<p><a href=\"{PREFIX}\">Sign in</a></p>",
            pages::message(&text, &Notice::None)
        ),
        _ => pages::message(&text, &Notice::Bad(&text)),
    };
    page(admin, status, "Not done", "", None, secure, &body)
}

/// A whole page with the headers every admin answer carries.
pub(super) fn page(
    admin: &Admin,
    status: StatusCode,
    title: &str,
    current: &str,
    csrf: Option<&str>,
    secure: bool,
    body: &str,
) -> Reply {
    let html = pages::document(title, current, csrf, &admin.shell(secure), body);
    let mut reply = Response::new(Full::new(Bytes::from(html)));
    *reply.status_mut() = status;
    guard(&mut reply, "text/html; charset=utf-8");
    reply
}

/// Headers every admin answer carries.
pub(super) fn guard(reply: &mut Reply, content_type: &'static str) {
    crate::pairing::page::guard_headers(
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

/// `303 See Other` to an admin path (after a POST, or to sign in).
pub(super) fn redirect(to: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = StatusCode::SEE_OTHER;
    guard(&mut reply, "text/plain; charset=utf-8");
    reply
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    reply
}

/// Adds `Set-Cookie` headers (one per cookie, as browsers need them).
pub(super) fn set_cookies(reply: &mut Reply, cookies: &[String]) {
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(c) {
            reply.headers_mut().append(header::SET_COOKIE, v);
        }
    }
}
