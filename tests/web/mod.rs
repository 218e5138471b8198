//! A browser without a browser for the admin page's tests: a cookie jar and raw HTTP/1.1 over
//! a real socket to the real binary (tests/common's `raw_http`), with the page's own forms.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{self, Gateway};

/// One answer, read to the close.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a hidden form field (`name="csrf" value="…"`).
    pub fn field(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no field {name} in:\n{}", self.body))
            + marker.len();
        self.body[start..]
            .split('"')
            .next()
            .unwrap_or("")
            .to_owned()
    }

    /// The text inside `<pre id="log">`.
    pub fn pre(&self, id: &str) -> String {
        let open = format!("<pre id=\"{id}\">");
        let start = self.body.find(&open).expect("the pre") + open.len();
        let end = self.body[start..].find("</pre>").expect("its end") + start;
        self.body[start..end].to_owned()
    }
}

pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub struct Web {
    addr: SocketAddr,
    jar: HashMap<String, String>,
}

impl Web {
    pub fn new(gw: &Gateway) -> Web {
        Web {
            addr: gw.addr,
            jar: HashMap::new(),
        }
    }

    pub async fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Reply {
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(self.addr),
        )
        .await
        .expect("connect in time")
        .expect("connect");
        let cookies: Vec<String> = self
            .jar
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let cookie = if cookies.is_empty() {
            String::new()
        } else {
            format!("Cookie: {}\r\n", cookies.join("; "))
        };
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/html\r\n{cookie}\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let common::RawHttp {
            status,
            headers,
            body,
        } = common::raw_http(tcp, &request, Duration::from_secs(60)).await;
        for (k, v) in headers.iter().filter(|(k, _)| k == "set-cookie") {
            let _ = k;
            if let Some((name, value)) = v.split(';').next().and_then(|f| f.split_once('=')) {
                self.jar.insert(name.to_owned(), value.to_owned());
            }
        }
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, None).await
    }

    /// A form posted with the session's CSRF token added.
    pub async fn post(&mut self, path: &str, pairs: &[(&str, &str)]) -> Reply {
        let csrf = self.csrf().await;
        let mut body = format!("csrf={}", encode(&csrf));
        for (k, v) in pairs {
            body += &format!("&{k}={}", encode(v));
        }
        self.request("POST", path, Some(&body)).await
    }

    /// Set-up from the page: claims the box with `passphrase`.
    pub async fn claim(&mut self, passphrase: &str) {
        let page = self.get("/admin/").await;
        let pre = page.field("pre");
        let body = format!(
            "pre={}&passphrase={p}&confirm={p}",
            encode(&pre),
            p = encode(passphrase)
        );
        let r = self.request("POST", "/admin/setup", Some(&body)).await;
        assert_eq!(r.status, 200, "claim: {r:?}");
    }

    pub async fn sign_in(&mut self, passphrase: &str) -> Reply {
        self.jar.clear();
        let page = self.get("/admin/").await;
        let pre = page.field("pre");
        let body = format!("pre={}&passphrase={}", encode(&pre), encode(passphrase));
        self.request("POST", "/admin/signin", Some(&body)).await
    }

    pub async fn csrf(&mut self) -> String {
        let page = self.get("/admin/").await;
        assert_eq!(page.status, 200, "not signed in: {page:?}");
        page.field("csrf")
    }
}
