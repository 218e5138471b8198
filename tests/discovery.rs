//! LAN discovery, for real: the gateway binary advertises itself with mDNS and an independent
//! browser (python-zeroconf, tests/peers/mdns_browse.py) on another "host" finds it, resolves
//! it, reaches it, and sees it leave on SIGTERM.
//!
//! The two hosts are two network namespaces joined by a veth pair, so the multicast really
//! crosses a link, and nothing reaches this machine's own network: the gateway listens on
//! 0.0.0.0 (it advertises only where it can be reached, never from loopback), which outside a
//! namespace would announce it on the real LAN. Making namespaces needs root (CAP_NET_ADMIN):
//! without it these tests fail under CI (`CI` set) and, elsewhere, say NOT RUN loudly and pass.
//!
//! python-zeroconf (PyPI `zeroconf`, pinned below) is installed on first use into a cached venv,
//! `~/.cache/iris-gateway/zeroconf-VERSION`, under a file lock, as the Hermes tests do.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const ZEROCONF_VERSION: &str = "0.154.0";
const BROWSER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/mdns_browse.py");
const SERVICE_TYPE: &str = "_iris-gw._tcp.local.";
/// The gateway's and the phone's addresses on the veth link (inside the namespaces only).
const GATEWAY_ADDR: &str = "10.231.0.1";
const PHONE_ADDR: &str = "10.231.0.2";
/// Longest wait for any one thing the test expects (a line, a resolution, a goodbye).
const STEP: Duration = Duration::from_secs(20);

/// Why these tests cannot run here (root, and iproute2 to build the namespaces), or `None`.
fn lacks_privilege() -> Option<String> {
    if let Some(why) = common::proc::lacks_privilege("network namespaces need CAP_NET_ADMIN") {
        return Some(why);
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        _ => Some("`ip` (iproute2) is not installed".into()),
    }
}

/// Under CI a missing privilege is a failure; elsewhere a loud skip.
fn skip_or_fail(test: &str) -> bool {
    let Some(why) = lacks_privilege() else {
        return false;
    };
    if std::env::var_os("CI").is_some() {
        panic!("{test}: cannot run under CI: {why}");
    }
    eprintln!(
        "\n*** {test}: NOT RUN: {why}.\n*** LAN discovery is untested on this machine; run the \
         suite as root to cover it.\n"
    );
    true
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace, deleted (with its end of any veth pair) on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("iris-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, args: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", &self.0];
        full.extend_from_slice(args);
        run(&full);
    }

    /// A command run inside the namespace (`ip netns exec` execs it: same pid).
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.0]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// The gateway's namespace and the phone's, joined by a veth pair.
fn lan() -> (Netns, Netns) {
    let gw = Netns::new("gw");
    let phone = Netns::new("phone");
    gw.exec(&[
        "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1", "netns", &phone.0,
    ]);
    gw.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{GATEWAY_ADDR}/24"),
        "dev",
        "lan0",
    ]);
    gw.exec(&["ip", "link", "set", "lan0", "up"]);
    phone.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{PHONE_ADDR}/24"),
        "dev",
        "lan1",
    ]);
    phone.exec(&["ip", "link", "set", "lan1", "up"]);
    (gw, phone)
}

/// A child whose stdout lines arrive on a channel and whose stderr is kept for messages.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdin: Option<ChildStdin>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let err = child.stderr.take().expect("piped stderr");
        let keep = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut kept = keep.lock().unwrap_or_else(|p| p.into_inner());
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        let stdin = child.stdin.take();
        Proc {
            child,
            lines,
            stdin,
            stderr,
            seen: Vec::new(),
        }
    }

    /// The first stdout line (from now) that `want` accepts, within [`STEP`].
    fn line_where(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no {what} within {STEP:?}\nstdout:\n{}\nstderr:\n{}",
                    self.seen.join("\n"),
                    self.stderr()
                ),
            }
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for `needle` on stderr, within [`STEP`].
    fn stderr_shows(&self, needle: &str) {
        let deadline = Instant::now() + STEP;
        while !self.stderr().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "stderr never said {needle:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sigterm_and_wait(&mut self) -> std::process::ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit within {STEP:?} of SIGTERM\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts the real binary in `ns`, listening on 0.0.0.0 (an ephemeral port); returns it with
/// the port and the certificate fingerprint it printed.
fn start_gateway(ns: &Netns, data_dir: &Path) -> (Proc, u16, String) {
    let mut cmd = ns.command(common::bin());
    cmd.arg("run").arg("--data-dir").arg(data_dir).args([
        "--listen",
        "0.0.0.0:0",
        "--log-level",
        "debug",
    ]);
    let mut gw = Proc::spawn(cmd);
    let plain = gw.line_where("`listening on ws://` line", |l| {
        l.starts_with("listening on ws://")
    });
    let port: u16 = plain
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {plain:?}"));
    let tls = gw.line_where("`listening on wss://` line", |l| {
        l.starts_with("listening on wss://")
    });
    let fingerprint = tls
        .split("SHA-256 ")
        .nth(1)
        .and_then(|rest| rest.split([';', ')']).next())
        .unwrap_or_else(|| panic!("no fingerprint in {tls:?}"))
        .to_owned();
    (gw, port, fingerprint)
}

/// The venv's python with zeroconf, installed on first use (tests/common/peers.rs).
fn zeroconf_python() -> PathBuf {
    let zeroconf = format!("zeroconf=={ZEROCONF_VERSION}");
    common::peers::cached_venv("zeroconf", ZEROCONF_VERSION, &[&zeroconf], "bin/python")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn event(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("browser printed non-JSON ({e}): {line}"))
}

fn short_hostname() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").expect("read the host name");
    name.trim()
        .to_ascii_lowercase()
        .split('.')
        .next()
        .unwrap_or("")
        .to_owned()
}

#[test]
fn a_phone_on_the_lan_finds_resolves_and_reaches_the_gateway_and_sees_it_leave() {
    if skip_or_fail("a_phone_on_the_lan_finds_resolves_and_reaches_the_gateway_and_sees_it_leave") {
        return;
    }
    let python = zeroconf_python();
    let (gw_ns, phone_ns) = lan();
    let dir = common::temp_data_dir();

    // The browser first, so it sees the gateway's unsolicited announcement as a phone would.
    let mut browse = phone_ns.command(&python);
    browse.args([BROWSER, SERVICE_TYPE, PHONE_ADDR, "90"]);
    let mut phone = Proc::spawn(browse);
    phone.line_where("browser `ready`", |l| event(l)["event"] == "ready");

    let (mut gw, port, fingerprint) = start_gateway(&gw_ns, dir.path());
    let resolved =
        event(&phone.line_where("`resolved` event", |l| event(l)["event"] == "resolved"));

    let host = short_hostname();
    let instance = format!("Iris on {host}.{SERVICE_TYPE}");
    assert_eq!(resolved["name"], instance.as_str(), "{resolved}");
    assert_eq!(resolved["server"], format!("{host}.local."), "{resolved}");
    assert_eq!(resolved["port"], port, "{resolved}");
    assert_eq!(
        resolved["addresses"],
        serde_json::json!([GATEWAY_ADDR]),
        "{resolved}"
    );
    let txt = &resolved["txt"];
    assert_eq!(txt["v"], "1", "protocol version: {resolved}");
    assert_eq!(txt["tls"], "1", "{resolved}");
    assert_eq!(txt["plain"], "1", "{resolved}");
    assert_eq!(
        txt["fp"],
        fingerprint.replace(':', "").as_str(),
        "the TXT fingerprint is the served certificate's: {resolved}"
    );
    assert_eq!(
        resolved["reachable"], true,
        "the phone could not connect to the advertised address and port: {resolved}"
    );

    let status = gw.sigterm_and_wait();
    assert!(status.success(), "SIGTERM exit {status:?}\n{}", gw.stderr());
    let removed = event(
        &phone.line_where("`removed` event (goodbye) after SIGTERM", |l| {
            event(l)["event"] == "removed"
        }),
    );
    assert_eq!(removed["name"], instance.as_str(), "{removed}");
    assert!(
        gw.stderr().contains("LAN discovery: withdrawn"),
        "{}",
        gw.stderr()
    );
    if let Some(mut stdin) = phone.stdin.take() {
        let _ = stdin.write_all(b"");
    }
}

#[test]
fn without_a_network_to_announce_on_the_gateway_warns_and_serves() {
    if skip_or_fail("without_a_network_to_announce_on_the_gateway_warns_and_serves") {
        return;
    }
    // A namespace with loopback only: nothing can take a LAN announcement.
    let ns = Netns::new("alone");
    let dir = common::temp_data_dir();
    let (mut gw, _port, _fp) = start_gateway(&ns, dir.path());
    gw.stderr_shows("no interface took the mDNS announcement");
    assert!(
        gw.child.try_wait().expect("try_wait").is_none(),
        "the gateway must keep running without discovery\n{}",
        gw.stderr()
    );
    let status = gw.sigterm_and_wait();
    assert!(status.success(), "SIGTERM exit {status:?}\n{}", gw.stderr());
}
