//! A fake HTTP/1.1 server on 127.0.0.1 (an agent, an ntfy server): it reads each request in
//! full, answers it as told and closes the connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// One request the fake server took.
pub struct Taken {
    /// The request line, trimmed (`POST /topic HTTP/1.1`).
    pub line: String,
    /// The headers in order: name lower-cased, value trimmed.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Taken {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Starts the server on a thread; `answer` gets each request and returns the whole response
/// (status line, headers, body). Returns the server's `http://127.0.0.1:PORT`.
pub fn start(answer: impl Fn(Taken) -> Vec<u8> + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a fake HTTP server");
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let response = answer(read_request(&stream));
            let _ = stream.write_all(&response);
        }
    });
    url
}

/// Reads one whole request (line, headers, a `Content-Length` body) from `stream`.
pub fn read_request(stream: &TcpStream) -> Taken {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let (mut length, mut headers) = (0usize, Vec::new());
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        let (name, value) = h.split_once(':').unwrap_or((&h, ""));
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
        if name == "content-length" {
            length = value.parse().unwrap_or(0);
        }
        headers.push((name, value));
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    Taken {
        line: line.trim().to_owned(),
        headers,
        body,
    }
}

/// A `200 OK` JSON response with `body`, closing the connection.
pub fn json_200(body: &[u8]) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body);
    response
}

/// As [`start`], but `answer` writes the response itself, as slowly or as cut short as it
/// likes (a slow link, a download broken off); the connection closes when it returns.
pub fn start_streaming(answer: impl Fn(Taken, &mut dyn Write) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a fake HTTP server");
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            answer(read_request(&stream), &mut stream);
        }
    });
    url
}
