//! A browser without a browser for the admin page's tests: a cookie jar, a source address,
//! raw HTTP/1.1 over a fresh connection per request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::Gateway;

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

    /// `name=value` of each `Set-Cookie`.
    pub fn cookies(&self) -> HashMap<String, String> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "set-cookie")
            .filter_map(|(_, v)| {
                let first = v.split(';').next()?;
                let (k, v) = first.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect()
    }

    /// What the body has between `start` and the next `end` (panics without `start`).
    pub fn after(&self, start: &str, end: &str) -> &str {
        let (_, rest) = self.body.split_once(start).expect(start);
        rest.split(end).next().unwrap_or("")
    }

    /// The text of the `<code>` that follows `start`, its tags removed: long values (a token,
    /// a URL, an id) are set as groups (`<span class="token">` between `<wbr>`s).
    pub fn code_after(&self, start: &str) -> String {
        let html = self.after(start, "</code>");
        let mut text = String::new();
        let mut in_tag = false;
        for c in html.chars() {
            match c {
                '<' => in_tag = true,
                '>' => in_tag = false,
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        text
    }

    /// What the page says about the last form (its one-time notice).
    pub fn notice(&self) -> &str {
        self.after("id=\"notice\">", "<")
    }

    /// The value of a hidden form field (`name="csrf" value="…"`).
    /// The text inside `<pre id="{id}">`.
    pub fn pre(&self, id: &str) -> String {
        let open = format!("<pre id=\"{id}\">");
        let start = self.body.find(&open).expect("the pre") + open.len();
        let end = self.body[start..].find("</pre>").expect("its end") + start;
        self.body[start..end].to_owned()
    }

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
}

/// A browser without a browser: a cookie jar, a source address, raw HTTP/1.1.
pub struct Web {
    pub addr: SocketAddr,
    pub from: String,
    pub jar: HashMap<String, String>,
}

pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", iris_gateway::pairing::percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

impl Web {
    pub fn new(gw: &Gateway, from: &str) -> Web {
        Web {
            addr: gw.addr,
            from: from.to_owned(),
            jar: HashMap::new(),
        }
    }

    /// A client for a gateway this test did not start itself (a scratch root's service).
    pub fn at(addr: SocketAddr, from: &str) -> Web {
        Web {
            addr,
            from: from.to_owned(),
            jar: HashMap::new(),
        }
    }

    /// POSTs `bytes` as the body (a file upload, sent as the page's script sends it), with the
    /// session's cookies and `extra` header lines.
    pub async fn upload(&mut self, path: &str, bytes: &[u8], extra: &str) -> Reply {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let cookies: Vec<String> = self.jar.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\n{extra}\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            self.addr,
            cookies.join("; "),
            bytes.len()
        );
        tcp.write_all(head.as_bytes()).await.expect("send the head");
        // A refusal may come before the whole body is read (and close the socket).
        let _ = tcp.write_all(bytes).await;
        let super::RawHttp {
            status,
            headers,
            body,
        } = super::raw_http(tcp, "", Duration::from_secs(120)).await;
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Reply {
        self.request_with(method, path, body, "").await
    }

    /// As [`Web::request`], with `extra` header lines (each ending in `\r\n`).
    pub async fn request_with(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        extra: &str,
    ) -> Reply {
        let form = "application/x-www-form-urlencoded";
        self.send(method, path, body, form, extra).await
    }

    /// A form with a file, as a browser sends `enctype="multipart/form-data"`, with the
    /// session's CSRF token added; its `303` is followed, as in [`Web::post`]. Each of `files`
    /// is (field, file name, content).
    pub async fn post_multipart(
        &mut self,
        path: &str,
        fields: &[(&str, &str)],
        files: &[(&str, &str, &str)],
    ) -> Reply {
        const BOUNDARY: &str = "----iris-test-boundary-7MA4YWxkTrZu0gW";
        let csrf = self.csrf().await;
        let mut body = String::new();
        for (name, value) in std::iter::once(&("csrf", csrf.as_str())).chain(fields) {
            body += &format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            );
        }
        for (name, file, content) in files {
            body += &format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{file}\"\r\nContent-Type: application/json\r\n\r\n{content}\r\n"
            );
        }
        body += &format!("--{BOUNDARY}--\r\n");
        let kind = format!("multipart/form-data; boundary={BOUNDARY}");
        let reply = self.send("POST", path, Some(&body), &kind, "").await;
        self.follow(reply).await
    }

    /// A form's `303 See Other` followed with a GET, as a browser does.
    async fn follow(&mut self, reply: Reply) -> Reply {
        match reply.header("location") {
            Some(to) if reply.status == 303 => {
                let to = to.to_owned();
                self.get(&to).await
            }
            _ => reply,
        }
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        content_type: &str,
        extra: &str,
    ) -> Reply {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{}:0", self.from).parse::<SocketAddr>().unwrap())
            .expect("bind the client address");
        let tcp = tokio::time::timeout(Duration::from_secs(10), socket.connect(self.addr))
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
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/html\r\n{cookie}{extra}\
             Content-Type: {content_type}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let super::RawHttp {
            status,
            headers,
            body,
        } = super::raw_http(tcp, &request, Duration::from_secs(30)).await;
        let reply = Reply {
            status,
            headers,
            body,
        };
        for (k, v) in reply.cookies() {
            self.jar.insert(k, v);
        }
        reply
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, None).await
    }

    /// A form sent as a browser sends it: its `303 See Other` is followed with a GET, whose
    /// answer is returned (every form but sign-in answers so).
    pub async fn post(&mut self, path: &str, pairs: &[(&str, &str)]) -> Reply {
        let reply = self.request("POST", path, Some(&form(pairs))).await;
        self.follow(reply).await
    }

    /// Set-up from the page: the passphrase twice, with the set-up form's own token.
    pub async fn claim(&mut self, passphrase: &str) -> Reply {
        let page = self.get("/admin/").await;
        assert_eq!(page.status, 200, "{page:?}");
        let pre = page.field("pre");
        self.post(
            "/admin/setup",
            &[
                ("pre", &pre),
                ("passphrase", passphrase),
                ("confirm", passphrase),
            ],
        )
        .await
    }

    /// Signs in afresh: any session this client held is dropped first.
    pub async fn sign_in(&mut self, passphrase: &str) -> Reply {
        self.jar.clear();
        let page = self.get("/admin/").await;
        let pre = page.field("pre");
        self.request_form(
            "/admin/signin",
            &[("pre", &pre), ("passphrase", passphrase)],
        )
        .await
    }

    /// A form with the session's CSRF token added, its answer returned as it is (a 303 not
    /// followed).
    pub async fn post_csrf(&mut self, path: &str, pairs: &[(&str, &str)]) -> Reply {
        let csrf = self.csrf().await;
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend_from_slice(pairs);
        self.request_form(path, &all).await
    }

    /// A form whose answer is returned as it is (a 303 not followed).
    pub async fn request_form(&mut self, path: &str, pairs: &[(&str, &str)]) -> Reply {
        self.request("POST", path, Some(&form(pairs))).await
    }

    /// What the gateway makes of a new passphrase (the meter's question), with the page's token.
    pub async fn strength(&mut self, token: &str, passphrase: &str) -> (u16, serde_json::Value) {
        let extra = format!("X-CSRF-Token: {token}\r\n");
        let body = form(&[("passphrase", passphrase)]);
        let r = self
            .request_with("POST", "/admin/strength", Some(&body), &extra)
            .await;
        let v = serde_json::from_str(&r.body).unwrap_or(serde_json::Value::Null);
        (r.status, v)
    }

    /// The page of the admin job `kind` (`/admin/job/KIND`) once the job has ended (bounded):
    /// its answer, a `200` with the outcome, or a `303` onwards (a restore that succeeded).
    pub async fn job_outcome(&mut self, kind: &str) -> Reply {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let page = self.get(&format!("/admin/job/{kind}")).await;
            if !page.body.contains("data-phase=\"running\"") {
                return page;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the {kind} job still runs: {}",
                page.body
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The CSRF token of the signed-in session (from any of its pages).
    pub async fn csrf(&mut self) -> String {
        let page = self.get("/admin/").await;
        assert_eq!(page.status, 200, "not signed in: {page:?}");
        page.field("csrf")
    }
}
