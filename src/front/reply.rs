//! The front's own answers: whole bodies, each closing its connection (one request per connection).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

pub type Reply = Response<Full<Bytes>>;

/// A closing answer with a body of `content_type`.
pub fn answer(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = status;
    let h = reply.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    reply
}

pub fn text(status: StatusCode, body: &str) -> Reply {
    answer(
        status,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_owned()),
    )
}

pub fn json(status: StatusCode, body: &serde_json::Value) -> Reply {
    answer(status, "application/json", Bytes::from(body.to_string()))
}

pub fn with_allow(mut reply: Reply, methods: &'static str) -> Reply {
    reply
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(methods));
    reply
}
