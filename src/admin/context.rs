//! What the gate learns of a request once, handed to every handler: where it came from, over
//! what, and (signed in) whose session with which CSRF token. Handlers take these instead of a
//! `secure` flag, a CSRF string and a session check of their own, so what a session needs is
//! decided in one place ([`Gate::of`]), and whether a cookie must be `Secure` in one
//! ([`Ctx::cookie`]).

use std::net::SocketAddr;
use std::time::Instant;

use super::{owner, session, Admin};
use crate::web::Channel;

/// Every request: its peer and whether it came over TLS (its cookies must be `Secure`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ctx {
    peer: SocketAddr,
    channel: Channel,
}

impl Ctx {
    pub(super) fn new(peer: SocketAddr, channel: Channel) -> Ctx {
        Ctx { peer, channel }
    }

    pub(super) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// How it came: over TLS the page's shell leaves off the warning a plain page carries.
    pub(super) fn channel(&self) -> Channel {
        self.channel
    }

    /// A `Set-Cookie` value for cookie `name` in this request's answer: `Secure` when it came
    /// over TLS (an empty value with `Max-Age=0` removes the cookie).
    pub(super) fn cookie(&self, name: &str, value: &str) -> String {
        let secure = if self.channel.is_encrypted() {
            "; Secure"
        } else {
            ""
        };
        let age = if value.is_empty() { "; Max-Age=0" } else { "" };
        format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict{secure}{age}")
    }
}

/// A request from the signed-in owner: the session the gate found for it.
pub(super) struct SignedIn {
    ctx: Ctx,
    session: session::Valid,
}

impl SignedIn {
    pub(super) fn peer(&self) -> SocketAddr {
        self.ctx.peer
    }

    /// The request's own context: its peer and https-ness.
    pub(super) fn ctx(&self) -> Ctx {
        self.ctx
    }

    /// The session's CSRF token: every form of its pages carries it.
    pub(super) fn csrf(&self) -> &str {
        &self.session.csrf
    }

    /// The session's key, under which a form leaves its outcome (`outcome.rs`).
    pub(super) fn key(&self) -> &[u8; 32] {
        &self.session.key
    }
}

/// Who is asking, as far as the owner file and the session table say.
pub(super) enum Gate {
    /// The owner file could not be read.
    Unreadable(owner::OwnerError),
    /// The box has no owner yet: set-up only.
    Unclaimed,
    /// Claimed, and the cookie names no live session of the owner's.
    SignedOut(owner::Owner),
    SignedIn(owner::Owner, SignedIn),
}

impl Gate {
    /// The one session gate: the pages, the transfers and the strength meter all ask it.
    pub(super) fn of(admin: &Admin, headers: &hyper::HeaderMap, ctx: Ctx) -> Gate {
        let owner = match owner::load(&admin.data_dir) {
            Ok(Some(o)) => o,
            Ok(None) => return Gate::Unclaimed,
            Err(e) => return Gate::Unreadable(e),
        };
        let valid = session::cookie(headers, session::COOKIE).and_then(|id| {
            admin
                .sessions
                .borrow_mut()
                .check(id, owner.stamp(), Instant::now())
        });
        match valid {
            Some(session) => Gate::SignedIn(owner, SignedIn { ctx, session }),
            None => Gate::SignedOut(owner),
        }
    }
}
