//! How a browser's request came (over TLS or plain HTTP, to the one port) is decided once by the
//! front door and reaches both browser doors: the admin page's connection note and the `Secure`
//! flag of its cookies, and the pairing page's plain-HTTP warning.

mod common;

use std::process::Command;

use common::{temp_data_dir, Gateway};

/// The whole answer (status line, headers, body) to a GET of `url`, by `curl`: over TLS the
/// gateway's self-signed certificate is taken as it is (the page itself shows its fingerprint).
fn get(url: &str) -> String {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--include", "--insecure"])
        .args(["--max-time", "20", url])
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("a page in UTF-8")
}

fn set_cookie(answer: &str) -> &str {
    answer
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie in:\n{answer}"))
}

const PLAIN_WARNING: &str = "This page came over plain HTTP";

#[test]
fn over_tls_a_page_shows_the_certificate_and_its_cookies_are_secure_over_plain_http_neither() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let encrypted = get(&format!("https://{}/admin/", gw.addr));
    assert!(encrypted.starts_with("HTTP/1.1 200"), "{encrypted}");
    assert!(set_cookie(&encrypted).contains("; Secure"), "{encrypted}");
    assert!(encrypted.contains("id=\"fingerprint\""), "{encrypted}");
    assert!(!encrypted.contains(PLAIN_WARNING), "{encrypted}");

    let plain = get(&format!("http://{}/admin/", gw.addr));
    assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");
    assert!(!set_cookie(&plain).contains("Secure"), "{plain}");
    assert!(!plain.contains("id=\"fingerprint\""), "{plain}");
    assert!(
        plain.contains(PLAIN_WARNING) && plain.contains("id=\"plain-warning\""),
        "{plain}"
    );

    let pairing_encrypted = get(&format!("https://{}/pair", gw.addr));
    assert!(
        pairing_encrypted.starts_with("HTTP/1.1 200"),
        "{pairing_encrypted}"
    );
    assert!(
        !pairing_encrypted.contains(PLAIN_WARNING),
        "{pairing_encrypted}"
    );
    let pairing_plain = get(&format!("http://{}/pair", gw.addr));
    assert!(pairing_plain.contains(PLAIN_WARNING), "{pairing_plain}");
}
