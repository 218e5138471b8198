//! `iris-gateway chat`, the terminal client, against the real gateway: it pairs itself through
//! the data dir, sends typed lines, renders the streamed turn, and reuses its credentials.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, BIN};

/// Runs the client with `lines` on stdin, keeping stdin open for `linger` so the reply can
/// stream in before the client sees end-of-input and quits. Returns (exit ok, stdout).
fn chat(
    data_dir: &std::path::Path,
    extra: &[&str],
    lines: &str,
    linger: Duration,
) -> (bool, String) {
    let mut child = Command::new(BIN)
        .arg("chat")
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chat");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(lines.as_bytes()).unwrap();
    std::thread::sleep(linger);
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        format!("{stdout}\n--- stderr ---\n{stderr}"),
    )
}

#[test]
fn chat_pairs_itself_renders_a_turn_and_reuses_its_token() {
    let dir = common::temp_data_dir();
    let _gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);

    let (ok, out) = chat(
        dir.path(),
        &[],
        "hello there world\n",
        Duration::from_secs(3),
    );
    assert!(ok, "chat failed:\n{out}");
    // The reply streamed and finished, with the tool call, todo list, reasoning and footer.
    assert!(out.contains("That is 3 words and 17 characters."), "{out}");
    assert!(out.contains("word_count"), "no tool line:\n{out}");
    assert!(out.contains("todo:"), "no todo line:\n{out}");
    assert!(out.contains("reasoning:"), "no reasoning:\n{out}");
    assert!(out.contains("iris-demo"), "no footer:\n{out}");
    // Text grows in place: the final reply appears once, not once per update.
    assert_eq!(out.matches("That is 3 words").count(), 1, "{out}");

    let creds = dir.path().join("chat-client.json");
    assert!(creds.exists(), "the client keeps its token in the data dir");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "credentials must be private");

    // A second run reuses the device instead of pairing a new one, and talks in a new channel.
    let (ok, out) = chat(
        dir.path(),
        &["--channel", "Garden"],
        "",
        Duration::from_millis(800),
    );
    assert!(ok, "{out}");
    assert!(out.contains("[created channel Garden]"), "{out}");
    let devices = common::devices_json(dir.path());
    let chat_devices = devices
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["name"] == "terminal chat")
        .count();
    assert_eq!(chat_devices, 1, "{devices}");
}
