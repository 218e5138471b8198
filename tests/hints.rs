//! Every command the gateway prints, typed as printed, reaches this gateway: its start-up
//! lines and the commands' own advice carry the data dir (and address) it runs on, on a
//! non-default data dir and port. And a command that only reads never makes a store where
//! there is none.
//!
//! Each command runs with its own default data dir (`XDG_DATA_HOME`) in the test's scratch
//! space, so a hint that leaves out `--data-dir` shows as a store made there.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

const TYPED_TIMEOUT: Duration = Duration::from_secs(30);

/// A scratch root: the gateway's data dir (with a space, so the hints must quote it) and the
/// empty home every typed command gets.
struct Scratch {
    _root: tempfile::TempDir,
    data: PathBuf,
    xdg: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let root = temp_data_dir();
        let data = root.path().join("my data");
        let xdg = root.path().join("xdg");
        std::fs::create_dir_all(&xdg).unwrap();
        Scratch {
            data,
            xdg,
            _root: root,
        }
    }

    fn env(&self) -> [(&'static str, &Path); 2] {
        [("XDG_DATA_HOME", &self.xdg), ("HOME", &self.xdg)]
    }

    /// The data dir a command given no `--data-dir` would use.
    fn default_store(&self) -> PathBuf {
        self.xdg.join("iris-gateway")
    }

    /// Runs `words` (a command as printed, without the program's name) through the binary.
    fn typed(&self, words: &[String], input: &str) -> Output {
        let mut cmd = gateway_command();
        cmd.args(words).env_remove("STATE_DIRECTORY");
        for (key, value) in self.env() {
            cmd.env(key, value);
        }
        run_bounded_input(
            cmd,
            input.as_bytes(),
            TYPED_TIMEOUT,
            &format!("`iris-gateway {}`", words.join(" ")),
        )
    }

    fn typed_ok(&self, words: &[String], input: &str) -> String {
        let out = self.typed(words, input);
        assert!(
            out.status.success(),
            "`iris-gateway {}`, typed as printed, failed ({}):\n{}\n{}",
            words.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn start(&self, listen: &str) -> Gateway {
        let env: Vec<(&str, &str)> = self
            .env()
            .iter()
            .map(|(k, v)| (*k, v.to_str().unwrap()))
            .collect();
        Gateway::start_with_env(&self.data, &["--listen", listen], &env)
    }
}

/// The commands in printed text: what follows `iris-gateway ` up to the end of the line or a
/// closing parenthesis, split as a shell would (single quotes), with `NAME` filled in.
fn printed_commands(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for line in text.lines() {
        for (at, _) in line.match_indices("iris-gateway ") {
            let rest = &line[at + "iris-gateway ".len()..];
            let words = shell_words(rest.split(')').next().unwrap_or(rest));
            // The `iris-gateway listening on …` line names the program, not a command.
            if words.first().is_some_and(|w| w != "listening") {
                found.push(
                    words
                        .into_iter()
                        .map(|w| if w == "NAME" { "typed".into() } else { w })
                        .collect(),
                );
            }
        }
    }
    found
}

fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                word.get_or_insert_with(String::new);
            }
            c if c.is_whitespace() && !quoted => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The printed command of subcommand `words[0]` that has all of `words`.
fn command_starting(commands: &[Vec<String>], words: &[&str]) -> Vec<String> {
    commands
        .iter()
        .find(|c| {
            c.first().map(String::as_str) == words.first().copied()
                && words.iter().all(|w| c.iter().any(|word| word == w))
        })
        .unwrap_or_else(|| {
            panic!(
                "no printed `iris-gateway {}` in {commands:?}",
                words.join(" ")
            )
        })
        .clone()
}

/// Waits until the gateway has printed every line that starts with one of `prefixes`.
fn printed_lines(gw: &Gateway, prefixes: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.stdout_tail();
        if prefixes
            .iter()
            .all(|p| out.lines().any(|l| l.starts_with(p)))
        {
            return out;
        }
        assert!(Instant::now() < deadline, "missing {prefixes:?} in:\n{out}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback address no one listens on now, to start the gateway on a port of our own.
fn free_loopback_address() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().to_string()
}

fn device_names(data_dir: &Path) -> Vec<String> {
    devices_json(data_dir)
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn start_up_hints_typed_as_printed_reach_the_running_gateway() {
    let s = Scratch::new();
    let listen = free_loopback_address();
    let mut gw = s.start(&listen);
    let out = printed_lines(
        &gw,
        &["or try it from a terminal:", "pairing page:", "admin page:"],
    );
    let commands = printed_commands(&out);

    let chat = command_starting(&commands, &["chat"]);
    s.typed_ok(&chat, "");
    assert!(
        device_names(&s.data).contains(&"terminal chat".to_owned()),
        "`{chat:?}` did not pair with the running gateway"
    );

    let page = command_starting(&commands, &["pair", "--page"]);
    let shown = s.typed_ok(&page, "");
    assert!(shown.contains("/pair"), "{shown}");

    let owner = command_starting(&commands, &["owner", "set"]);
    s.typed_ok(&owner, "violet-harbor-quantum-teapot-91\n");
    assert!(s.data.join("owner.json").is_file());

    // Once a device has connected, the next start offers to pair another.
    let phone = pair(&s.data, "phone");
    let (_client, ack) = Client::hello(&gw.url, &phone.token, "app-phone").await;
    assert_eq!(ack["type"], "hello.ack", "{ack}");
    gw.stop_ok();
    let gw = s.start(&listen);
    let out = printed_lines(&gw, &["pair another device with:"]);
    let another = command_starting(&printed_commands(&out), &["pair", "--name"]);
    assert!(
        another.windows(2).any(|w| w == ["--listen", &listen]),
        "{another:?} leaves out the address the gateway serves"
    );
    let shown = s.typed_ok(&another, "");
    let token = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("Token: "))
        .unwrap_or_else(|| panic!("no token in:\n{shown}"));
    let (_client, ack) = Client::hello(&gw.url, token, "app-typed").await;
    assert_eq!(ack["type"], "hello.ack", "{ack}");

    assert!(
        !s.default_store().exists(),
        "a printed command made a store in the default data dir"
    );
}

#[test]
fn a_commands_own_advice_carries_its_data_dir() {
    let s = Scratch::new();
    let data = s.data.to_str().unwrap().to_owned();
    let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let shown = s.typed_ok(&words(&["pair", "--data-dir", &data, "--no-qr"]), "");
    let revoke = command_starting(&printed_commands(&shown), &["devices", "revoke"]);
    s.typed_ok(&revoke, "");
    assert!(device_names(&s.data).is_empty());

    let shown = s.typed_ok(&words(&["devices", "--data-dir", &data]), "");
    let pair = command_starting(&printed_commands(&shown), &["pair", "--name"]);
    s.typed_ok(&pair, "");
    assert_eq!(device_names(&s.data), ["typed"]);

    let out = s.typed(&words(&["status", "--data-dir", &data]), "");
    let shown = String::from_utf8_lossy(&out.stdout);
    let run = command_starting(&printed_commands(&shown), &["run"]);
    assert!(
        run.windows(2).any(|w| w == ["--data-dir", &data]),
        "{run:?}"
    );
    assert!(!s.default_store().exists());
}

#[test]
fn a_read_only_command_on_a_directory_without_a_store_creates_nothing_and_says_where_it_is() {
    let s = Scratch::new();
    // A store where a command given no --data-dir looks: the one the message points to.
    s.typed_ok(&["pair".into(), "--name".into(), "x".into()], "");
    let default_store = s.default_store();
    assert!(default_store.join("db").is_dir());
    let missing = s.data.join("missing");
    let empty = s.data.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for dir in [&missing, &empty] {
        for command in [
            &["status"][..],
            &["devices"],
            &["devices", "revoke", "dev_x"],
            &["config", "--effective"],
            &["chat"],
        ] {
            let mut words: Vec<String> = command.iter().map(|w| w.to_string()).collect();
            words.extend(["--data-dir".into(), dir.to_str().unwrap().into()]);
            let out = s.typed(&words, "");
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{words:?} succeeded: {out:?}");
            assert!(
                said.contains(&format!("there is no gateway store in {}", dir.display()))
                    && said.contains(&format!("{}", default_store.display())),
                "{words:?} said: {said}"
            );
        }
    }
    assert!(!missing.exists(), "a read-only command made {missing:?}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}
