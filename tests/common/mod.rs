//! Shared integration-test harness: strict wire-schema validators derived from
//! `protocol/wire-v1.schema.json`, a gateway process wrapper, and a WebSocket client that checks
//! every frame the gateway sends against the schema.
#![allow(dead_code)]

pub mod cdp;
pub mod cursors;
pub mod fake_hermes;
pub mod fake_http;
pub mod fake_stt;
pub mod fake_tts;
pub mod fixtures;
pub mod gate;
pub mod mounts;
pub mod peers;
pub mod proc;
pub mod rng;
pub mod update_root;
pub mod web;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const SCHEMA_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/wire-v1.schema.json");
/// What the gateway adds to the shared schema (the extensions beyond v1), laid over it.
pub const EXTENSIONS_PATH: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/extensions-v1.json");
/// The binary Cargo built for this host. Prefer [`gateway_command`], which honours the run-time
/// overrides below; `BIN` itself always names the host build.
pub const BIN: &str = env!("CARGO_BIN_EXE_iris-gateway");

/// Run-time override of the binary under test: a path (relative paths are taken from the crate
/// root), e.g. `target/aarch64-unknown-linux-gnu/release/iris-gateway` (see `.ci/cross`).
pub const BIN_ENV: &str = "IRIS_GATEWAY_BIN";
/// Run-time command prefix for spawning the binary, split on whitespace, e.g.
/// `qemu-aarch64 -L /usr/aarch64-linux-gnu` to run an ARM build under qemu-user.
pub const RUNNER_ENV: &str = "IRIS_GATEWAY_RUNNER";

/// The binary the harness spawns: `$IRIS_GATEWAY_BIN` when set, else [`BIN`].
pub fn bin() -> &'static Path {
    static RESOLVED: OnceLock<PathBuf> = OnceLock::new();
    RESOLVED.get_or_init(|| match std::env::var_os(BIN_ENV) {
        Some(path) if !path.is_empty() => {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            assert!(
                path.is_file(),
                "{BIN_ENV}={} does not name a file",
                path.display()
            );
            path
        }
        _ => PathBuf::from(BIN),
    })
}

/// The `$IRIS_GATEWAY_RUNNER` prefix, split on whitespace (empty when unset).
pub fn runner() -> &'static [String] {
    static RUNNER: OnceLock<Vec<String>> = OnceLock::new();
    RUNNER.get_or_init(|| {
        std::env::var(RUNNER_ENV)
            .map(|r| r.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    })
}

/// A `Command` for the binary under test (through the runner, if any), with no arguments yet.
/// Killing or signalling the child reaches the gateway itself: qemu-user runs the guest in its
/// own process and forwards signals to it.
pub fn gateway_command() -> Command {
    match runner().split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin());
            cmd
        }
        None => Command::new(bin()),
    }
}

/// How the binary under test is started, for panic messages.
pub fn bin_display() -> String {
    let mut words = runner().to_vec();
    words.push(bin().display().to_string());
    words.join(" ")
}

// ---------------------------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------------------------

/// Strict per-frame validators for both directions, plus the reliability lists.
pub struct Schema {
    server: BTreeMap<String, jsonschema::Validator>,
    client: BTreeMap<String, jsonschema::Validator>,
    never_dropped: Vec<String>,
    coalescable: Vec<String>,
}

impl Schema {
    /// Parses the protocol file, with the gateway's extensions laid over it, once per test
    /// binary; every caller shares the validators.
    pub fn load() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| {
            let read = |path: &str| -> Value {
                let text = std::fs::read_to_string(path)
                    .unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
            };
            let mut doc = read(SCHEMA_PATH);
            let mut extensions = read(EXTENSIONS_PATH);
            if let Some(o) = extensions.as_object_mut() {
                o.remove("description");
            }
            lay_over(&mut doc, extensions);
            Schema::from_document(&doc)
        })
    }

    /// Builds the validators from an already parsed protocol description.
    pub fn from_document(doc: &Value) -> Schema {
        let mut definitions = doc.get("definitions").cloned().unwrap_or_else(|| json!({}));
        for def in definitions
            .as_object_mut()
            .expect("`definitions` must be an object")
            .values_mut()
        {
            make_strict(def);
        }
        let envelope = doc
            .pointer("/envelope/properties")
            .and_then(Value::as_object)
            .expect("`envelope.properties` missing");

        let build = |direction: &str| -> BTreeMap<String, jsonschema::Validator> {
            let frames = doc
                .pointer(&format!("/frame_types/{direction}"))
                .and_then(Value::as_object)
                .unwrap_or_else(|| panic!("`frame_types.{direction}` missing"));
            frames
                .iter()
                .map(|(name, frame)| {
                    let schema = frame_schema(name, frame, envelope, &definitions);
                    let validator = jsonschema::draft7::new(&schema).unwrap_or_else(|e| {
                        panic!("derived schema for {direction} `{name}` does not compile: {e}\n{schema:#}")
                    });
                    (name.clone(), validator)
                })
                .collect()
        };

        let strings = |pointer: &str| -> Vec<String> {
            doc.pointer(pointer)
                .and_then(Value::as_array)
                .unwrap_or_else(|| panic!("`{pointer}` missing"))
                .iter()
                .map(|s| {
                    s.as_str()
                        .expect("reliability entries are strings")
                        .to_owned()
                })
                .collect()
        };

        Schema {
            server: build("server_to_app"),
            client: build("app_to_server"),
            never_dropped: strings("/reliability/never_dropped"),
            coalescable: strings("/reliability/coalescable_under_backpressure"),
        }
    }

    pub fn validate_server_frame(&self, frame: &Value) -> Result<(), String> {
        validate_with(&self.server, "server→app", frame)
    }

    pub fn validate_client_frame(&self, frame: &Value) -> Result<(), String> {
        validate_with(&self.client, "app→server", frame)
    }

    /// Entries as written in the file; may contain globs such as `channel.*`
    /// (see [`Schema::is_never_dropped`]).
    pub fn never_dropped(&self) -> Vec<String> {
        self.never_dropped.clone()
    }

    pub fn coalescable(&self) -> Vec<String> {
        self.coalescable.clone()
    }

    /// Resolves the `prefix.*` globs the file uses in `never_dropped`.
    pub fn is_never_dropped(&self, frame_type: &str) -> bool {
        self.never_dropped
            .iter()
            .any(|p| glob_matches(p, frame_type))
    }

    pub fn is_coalescable(&self, frame_type: &str) -> bool {
        self.coalescable.iter().any(|p| glob_matches(p, frame_type))
    }

    pub fn server_frame_names(&self) -> Vec<String> {
        self.server.keys().cloned().collect()
    }

    pub fn client_frame_names(&self) -> Vec<String> {
        self.client.keys().cloned().collect()
    }
}

/// `prefix.*` globs as used in `reliability`; anything else must match exactly.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

fn validate_with(
    validators: &BTreeMap<String, jsonschema::Validator>,
    direction: &str,
    frame: &Value,
) -> Result<(), String> {
    let Some(frame_type) = frame.get("type").and_then(Value::as_str) else {
        return Err(format!("{direction} frame has no string `type`: {frame}"));
    };
    let Some(validator) = validators.get(frame_type) else {
        return Err(format!(
            "unknown {direction} frame type `{frame_type}`: {frame}"
        ));
    };
    let violations: Vec<String> = validator
        .iter_errors(frame)
        .map(|e| {
            let at = e.instance_path.to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            format!("  at {at}: {e}")
        })
        .collect();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{direction} `{frame_type}` frame violates wire-v1 schema:\n{}\nframe: {frame}",
            violations.join("\n")
        ))
    }
}

/// The file describes payloads as bare property maps (or a `$ref` to a definition); turn one frame
/// into a closed draft-07 schema so an extra or misspelled field anywhere is caught.
fn frame_schema(
    name: &str,
    frame: &Value,
    envelope: &Map<String, Value>,
    definitions: &Value,
) -> Value {
    let payload_desc = frame
        .get("payload")
        .unwrap_or_else(|| panic!("frame `{name}` has no payload description"));
    let payload = if let Some(reference) = payload_desc.get("$ref").and_then(Value::as_str) {
        let def = reference
            .strip_prefix("#/definitions/")
            .unwrap_or_else(|| panic!("frame `{name}`: unsupported payload $ref {reference}"));
        definitions
            .get(def)
            .cloned()
            .unwrap_or_else(|| panic!("frame `{name}`: unknown definition {reference}"))
    } else {
        let mut payload = json!({
            "type": "object",
            "properties": payload_desc.clone(),
        });
        make_strict(&mut payload);
        payload
    };

    let mut properties = envelope.clone();
    properties.insert("type".into(), json!({ "type": "string", "const": name }));
    properties.insert("payload".into(), payload);
    let mut schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "required": ["v", "type"],
        "properties": properties,
        "definitions": definitions.clone(),
    });
    make_strict(&mut schema);
    schema
}

/// Closes every object schema that lists `properties`; objects described without `properties`
/// (e.g. `tool.start.args`) are free-form by design and stay open.
fn make_strict(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(props) = obj.get_mut("properties").and_then(Value::as_object_mut) {
        for sub in props.values_mut() {
            make_strict(sub);
        }
        obj.entry("additionalProperties")
            .or_insert(Value::Bool(false));
    }
    match obj.get_mut("items") {
        Some(Value::Array(items)) => items.iter_mut().for_each(make_strict),
        Some(items) => make_strict(items),
        None => {}
    }
    if let Some(defs) = obj.get_mut("definitions").and_then(Value::as_object_mut) {
        defs.values_mut().for_each(make_strict);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(make_strict);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gateway process
// ---------------------------------------------------------------------------------------------

const TAIL_LINES: usize = 200;
const START_TIMEOUT: Duration = Duration::from_secs(20);
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

type Tail = Arc<Mutex<VecDeque<String>>>;

pub fn temp_data_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("iris-gw-test-")
        .tempdir()
        .expect("create temp data dir")
}

/// Echo child output live with `IRIS_TEST_ECHO=1` when a failure needs the full log.
fn echo_enabled() -> bool {
    std::env::var_os("IRIS_TEST_ECHO").is_some_and(|v| v != "0")
}

/// Reads lines until EOF so the child never blocks on a full pipe; keeps a bounded tail for
/// panic messages and optionally forwards each line to `tx`.
fn drain_lines<R: Read + Send + 'static>(
    reader: R,
    tail: Tail,
    label: &'static str,
    tx: Option<mpsc::Sender<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
            if echo_enabled() {
                eprintln!("[gateway {label}] {line}");
            }
            {
                let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.clone());
            }
            if let Some(tx) = &tx {
                // The receiver goes away once the listening line is found; later lines only
                // need to be drained.
                let _ = tx.send(line);
            }
        }
    })
}

fn tail_text(tail: &Tail) -> String {
    let tail = tail.lock().unwrap_or_else(|p| p.into_inner());
    tail.iter().cloned().collect::<Vec<_>>().join("\n")
}

/// A running `iris-gateway run` child process.
pub struct Gateway {
    child: Child,
    exit: Option<ExitStatus>,
    pub data_dir: PathBuf,
    pub url: String,
    pub addr: SocketAddr,
    stdout_tail: Tail,
    stderr_tail: Tail,
    readers: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Starts the gateway on an ephemeral loopback port with demo pacing off. `--listen` and
    /// `--demo-pace-ms` in `extra_args` replace those defaults (e.g. to restart on the same port).
    pub fn start(data_dir: &Path, extra_args: &[&str]) -> Gateway {
        Gateway::start_with_env(data_dir, extra_args, &[])
    }

    /// As `start`, with extra environment variables for the gateway (test hooks).
    pub fn start_with_env(data_dir: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Gateway {
        let mut cmd = gateway_command();
        cmd.envs(env.iter().copied());
        cmd.arg("run").arg("--data-dir").arg(data_dir);
        if !extra_args.iter().any(|a| a.starts_with("--listen")) {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !extra_args.iter().any(|a| a.starts_with("--demo-pace-ms")) {
            cmd.args(["--demo-pace-ms", "0"]);
        }
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", bin_display()));

        let stdout_tail: Tail = Arc::default();
        let stderr_tail: Tail = Arc::default();
        let (tx, rx) = mpsc::channel();
        let readers = vec![
            drain_lines(
                child.stdout.take().expect("piped stdout"),
                stdout_tail.clone(),
                "stdout",
                Some(tx),
            ),
            drain_lines(
                child.stderr.take().expect("piped stderr"),
                stderr_tail.clone(),
                "stderr",
                None,
            ),
        ];
        let mut gw = Gateway {
            child,
            exit: None,
            data_dir: data_dir.to_path_buf(),
            url: String::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stdout_tail,
            stderr_tail,
            readers,
        };

        let deadline = Instant::now() + START_TIMEOUT;
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = parse_listening_line(&line) {
                        break url;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    gw.kill9();
                    panic!(
                        "gateway did not print `listening on ws://…` within {START_TIMEOUT:?}\n{}",
                        gw.output_tail()
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: the process is exiting; give stderr a moment to flush the reason.
                    let status = gw.wait_exit(Duration::from_secs(5));
                    gw.settle_readers();
                    panic!(
                        "gateway exited ({status:?}) before listening\n{}",
                        gw.output_tail()
                    );
                }
            }
        };
        let addr = url
            .strip_prefix("ws://")
            .map(|rest| rest.split('/').next().unwrap_or(rest))
            .and_then(|hostport| hostport.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("cannot parse socket address from listening url {url:?}"));
        assert_ne!(addr.port(), 0, "gateway reported port 0: {url}");
        gw.url = url;
        gw.addr = addr;
        gw
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True until the child has exited (a zombie counts as exited once reaped here).
    pub fn is_running(&mut self) -> bool {
        self.poll_exit().is_none()
    }

    /// Hard crash: SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(status) = self.poll_exit() {
            return status;
        }
        // ESRCH only if it exited between the poll and here; wait() below handles both.
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait for killed gateway");
        self.exit = Some(status);
        self.settle_readers();
        status
    }

    /// Graceful stop: SIGTERM, then wait up to 10 s. Panics (after SIGKILL) if it hangs.
    /// SIGTERM, and the gateway must exit cleanly (a restart test's first half).
    pub fn stop_ok(&mut self) {
        let status = self.sigterm();
        assert!(
            status.success(),
            "SIGTERM exit: {status:?}\n{}",
            self.output_tail()
        );
    }

    pub fn sigterm(&mut self) -> ExitStatus {
        if let Some(status) = self.poll_exit() {
            return status;
        }
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: plain kill(2) on our own, not yet reaped, child; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            rc,
            0,
            "kill(SIGTERM) failed: {}",
            std::io::Error::last_os_error()
        );
        match self.wait_exit(Duration::from_secs(10)) {
            Some(status) => {
                self.settle_readers();
                status
            }
            None => {
                self.kill9();
                panic!(
                    "gateway did not exit within 10 s of SIGTERM\n{}",
                    self.output_tail()
                );
            }
        }
    }

    /// Waits for the child to exit by itself, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait on gateway");
        }
        self.exit
    }

    /// After exit the pipes close; waiting for the readers makes the tails complete. Bounded,
    /// because a grandchild that inherited the pipes could keep them open.
    fn settle_readers(&self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.readers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stdout_tail(&self) -> String {
        tail_text(&self.stdout_tail)
    }

    pub fn stderr_tail(&self) -> String {
        tail_text(&self.stderr_tail)
    }

    /// Both tails, formatted for panic messages.
    pub fn output_tail(&self) -> String {
        format!(
            "--- gateway stdout (tail) ---\n{}\n--- gateway stderr (tail) ---\n{}\n---",
            self.stdout_tail(),
            self.stderr_tail()
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // No panics here: Drop also runs while a failing test unwinds.
        if self.exit.is_none() && !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Readers end at EOF now that the child is gone; do not join (a grandchild holding
        // the pipe open must not hang the test).
    }
}

/// Extracts `ws://…` from a line such as `iris-gateway listening on ws://127.0.0.1:4711`.
fn parse_listening_line(line: &str) -> Option<String> {
    let rest = &line[line.find("listening on ws://")? + "listening on ".len()..];
    let url = rest.split_whitespace().next()?;
    Some(url.trim_end_matches([',', '.', ';', ')']).to_owned())
}

/// The address of the `n`th `listening on ws://` line the gateway printed (1-based; a restart
/// execs the gateway in the same process, which prints it again), waiting up to `within`.
pub async fn nth_listening(gw: &Gateway, n: usize, within: Duration) -> SocketAddr {
    let deadline = Instant::now() + within;
    loop {
        let out = gw.stdout_tail();
        let found: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split("listening on ws://").nth(1))
            .collect();
        if let Some(addr) = found.get(n - 1) {
            return addr.trim().parse().expect("an address");
        }
        assert!(
            Instant::now() < deadline,
            "no listening line #{n}:\n{}",
            gw.output_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The code the gateway printed at start (`pairing page: URL code XXXX-XXXX …`); it follows
/// the `listening on` line `Gateway::start` waits for, so it may take a moment.
pub fn startup_page_code(gw: &Gateway) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.stdout_tail();
        let code = out
            .lines()
            .find_map(|l| l.strip_prefix("pairing page: "))
            .and_then(|l| l.split(" code ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_owned);
        if let Some(code) = code {
            return code;
        }
        assert!(
            Instant::now() < deadline,
            "no pairing page code printed:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// CLI helpers
// ---------------------------------------------------------------------------------------------

/// Runs the binary with `args`, bounded by a 30 s timeout.
pub fn cli(args: &[&str]) -> Output {
    cli_os(args)
}

/// Like [`cli`] for arguments that are paths.
pub fn cli_os<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let mut cmd = gateway_command();
    cmd.args(args);
    run_bounded(
        cmd,
        CLI_TIMEOUT,
        &format!("`iris-gateway {}`", shown.join(" ")),
    )
}

/// Runs `cmd` with its output captured, bounded by `timeout` (then killed, and the test fails).
pub fn run_bounded(cmd: Command, timeout: Duration, what: &str) -> Output {
    run_bounded_input(cmd, b"", timeout, what)
}

/// As [`run_bounded`], with `input` on its standard input (then closed); none at all when empty.
pub fn run_bounded_input(mut cmd: Command, input: &[u8], timeout: Duration, what: &str) -> Output {
    let stdin = match input.is_empty() {
        true => Stdio::null(),
        false => Stdio::piped(),
    };
    let mut child = cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    if let Some(mut pipe) = child.stdin.take() {
        use std::io::Write;
        let input = input.to_vec();
        // A child that exits without reading must not block the test on a full pipe.
        std::thread::spawn(move || pipe.write_all(&input));
    }
    let collect = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = collect(Box::new(child.stdout.take().expect("piped stdout")));
    let err = collect(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Asserts success and returns stdout, with both streams in the panic message otherwise.
pub fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "`iris-gateway {}` failed: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cli stdout is UTF-8")
}

/// `owner set` from a pipe, as at the box: sets the admin passphrase of `data_dir`.
pub fn owner_set(data_dir: &Path, passphrase: &str) {
    use std::io::Write;
    let mut child = gateway_command()
        .args(["owner", "set", "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn owner set");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{passphrase}\n").as_bytes())
        .expect("write to the child");
    let out = child.wait_with_output().expect("owner set");
    assert!(out.status.success(), "owner set failed: {out:?}");
}

#[derive(Debug, Clone)]
pub struct Paired {
    pub token: String,
    pub url: String,
    pub device_id: String,
    /// The whole line, for fields beyond the three the tests rely on.
    pub json: Value,
}

/// Pairs a device through the real `pair --json` command (works with or without a running
/// gateway on the same data dir).
pub fn pair(data_dir: &Path, name: &str) -> Paired {
    let dir = data_dir.to_str().expect("data dir path is UTF-8");
    let stdout = cli_ok(&["pair", "--data-dir", dir, "--name", name, "--json"]);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "`pair --json` must print exactly one JSON line, got:\n{stdout}"
    );
    let json: Value = serde_json::from_str(lines[0])
        .unwrap_or_else(|e| panic!("`pair --json` printed invalid JSON ({e}): {}", lines[0]));
    let field = |key: &str| -> String {
        json.get(key)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("`pair --json` output lacks string `{key}`: {json}"))
            .to_owned()
    };
    Paired {
        token: field("token"),
        url: field("url"),
        device_id: field("device_id"),
        json,
    }
}

/// `devices --json`, parsed; the exact shape is left to the test that inspects it.
pub fn devices_json(data_dir: &Path) -> Value {
    let dir = data_dir.to_str().expect("data dir path is UTF-8");
    let stdout = cli_ok(&["devices", "--data-dir", dir, "--json"]);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("`devices --json` printed invalid JSON ({e}):\n{stdout}"))
}

pub fn revoke(data_dir: &Path, device_id: &str) {
    let dir = data_dir.to_str().expect("data dir path is UTF-8");
    cli_ok(&["devices", "--data-dir", dir, "revoke", device_id]);
}

// ---------------------------------------------------------------------------------------------
// WebSocket client
// ---------------------------------------------------------------------------------------------

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const SHOWN_FRAMES: usize = 12;

#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Text(Value),
    Binary(Vec<u8>),
    /// The close code and reason when the server sent a close frame; `None` on EOF or reset.
    Closed(Option<(u16, String)>),
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A protocol client that validates every server text frame against the strict schema.
pub struct Client {
    ws: Ws,
    /// Every text frame received, in order (each already schema-checked).
    pub seen: Vec<Value>,
    /// Every binary frame received, in order.
    pub binaries: Vec<Vec<u8>>,
    /// Set once the connection has ended: `Some(Some((code, reason)))` for a close frame.
    pub closed: Option<Option<(u16, String)>>,
    /// The transport error that ended the connection, if it did not end with a close frame.
    pub last_error: Option<String>,
    /// Bound on each recv-style call.
    pub timeout: Duration,
    /// Largest text frame this client takes, like an app: the gateway's default
    /// `limits.max_out_frame_bytes`. A bigger frame fails the test, whichever test it is.
    pub max_frame_in: usize,
    next_id: i64,
}

/// What an app can be expected to take: the gateway's own incoming limit, 1 MiB.
pub const APP_MAX_FRAME_BYTES: usize = 1 << 20;

impl Client {
    /// Opens a bare WebSocket: no `hello` yet, so a test can play the handshake itself.
    pub async fn open(url: &str) -> Client {
        match Client::try_open(url).await {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// For tests that expect the upgrade to be refused or the port to be closed.
    pub async fn try_open(url: &str) -> Result<Client, String> {
        Client::try_open_with(url, &[]).await
    }

    /// As [`Client::open`], the upgrade request carrying `headers` too (a `User-Agent`, as an
    /// app's HTTP library sends one).
    pub async fn open_with(url: &str, headers: &[(&str, &str)]) -> Client {
        match Client::try_open_with(url, headers).await {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    async fn try_open_with(url: &str, headers: &[(&str, &str)]) -> Result<Client, String> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
        let mut request = url
            .into_client_request()
            .map_err(|e| format!("{url} is no WebSocket URL: {e}"))?;
        for (name, value) in headers {
            request.headers_mut().insert(
                HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                HeaderValue::from_str(value).expect("a header value"),
            );
        }
        match tokio::time::timeout(DEFAULT_TIMEOUT, tokio_tungstenite::connect_async(request)).await
        {
            Err(_) => Err(format!("WebSocket connect to {url} timed out")),
            Ok(Err(e)) => Err(format!("WebSocket connect to {url} failed: {e}")),
            Ok(Ok((ws, _response))) => Ok(Client::over(ws)),
        }
    }

    fn over(ws: Ws) -> Client {
        Client {
            ws,
            seen: Vec::new(),
            binaries: Vec::new(),
            closed: None,
            last_error: None,
            timeout: DEFAULT_TIMEOUT,
            max_frame_in: APP_MAX_FRAME_BYTES,
            next_id: 1,
        }
    }

    /// Connects from `source` (any 127.0.0.0/8 address on loopback), so a test can play
    /// several client addresses against the per-address limits.
    pub async fn open_from(url: &str, addr: SocketAddr, source: std::net::IpAddr) -> Client {
        let socket = match source {
            std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .expect("socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .unwrap_or_else(|e| panic!("bind the client address {source}: {e}"));
        let connect = async {
            let tcp = socket.connect(addr).await.map_err(|e| e.to_string())?;
            tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(tcp))
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(DEFAULT_TIMEOUT, connect).await {
            Err(_) => panic!("WebSocket connect to {url} from {source} timed out"),
            Ok(Err(e)) => panic!("WebSocket connect to {url} from {source} failed: {e}"),
            Ok(Ok((ws, _response))) => Client::over(ws),
        }
    }

    /// Writes `bytes` to the socket under the WebSocket, for frames no client library would
    /// build (bad framing, invalid UTF-8); plain `ws://` only.
    pub async fn send_raw_wire(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let MaybeTlsStream::Plain(tcp) = self.ws.get_mut() else {
            panic!("send_raw_wire needs a plain ws:// connection");
        };
        tokio::time::timeout(self.timeout, tcp.write_all(bytes))
            .await
            .expect("raw write in time")
            .expect("raw write");
    }

    /// Connects, authenticates and returns the `hello.ack`; request ids continue from 2.
    pub async fn hello(url: &str, token: &str, device_id: &str) -> (Client, Value) {
        let mut c = Client::open(url).await;
        let ack = c.hello_on(token, device_id).await;
        (c, ack)
    }

    /// Sends `hello` (id 1) on an already open connection and waits for the `hello.ack`.
    pub async fn hello_on(&mut self, token: &str, device_id: &str) -> Value {
        self.send(json!({
            "v": 1,
            "type": "hello",
            "id": 1,
            "payload": { "token": token, "device_id": device_id, "device_name": "iris-test" },
        }))
        .await;
        self.next_id = self.next_id.max(2);
        let reply = self
            .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
            .await;
        if frame_type(&reply) == "error" {
            panic!("hello was refused: {reply}");
        }
        reply
    }

    /// Sends a frame after checking it against the app→server schema, so a test cannot drift
    /// outside the protocol by accident. Use `send_raw_*` for deliberately bad input.
    pub async fn send(&mut self, frame: Value) {
        if let Err(e) = Schema::load().validate_client_frame(&frame) {
            panic!("test tried to send an invalid frame:\n{e}");
        }
        self.send_message(Message::text(frame.to_string())).await;
    }

    pub async fn send_raw_text(&mut self, text: &str) {
        self.send_message(Message::text(text)).await;
    }

    pub async fn send_raw_binary(&mut self, bytes: Vec<u8>) {
        self.send_message(Message::binary(bytes)).await;
    }

    /// For sends that may legitimately fail because the server already closed.
    pub async fn try_send_raw(&mut self, msg: Message) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.ws.send(msg)).await {
            Err(_) => Err("send timed out".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(())) => Ok(()),
        }
    }

    async fn send_message(&mut self, msg: Message) {
        if let Err(e) = self.try_send_raw(msg).await {
            panic!("WebSocket send failed: {e}\n{}", self.recent());
        }
    }

    /// Sends a request with the next id and returns that id.
    pub async fn request(
        &mut self,
        frame_type: &str,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
        payload: Value,
    ) -> i64 {
        let id = self.next_id();
        let mut frame = json!({ "v": 1, "type": frame_type, "id": id, "payload": payload });
        if let Some(chat) = chat_id {
            frame["chat_id"] = json!(chat);
        }
        if let Some(thread) = thread_id {
            frame["thread_id"] = json!(thread);
        }
        self.send(frame).await;
        id
    }

    /// `message.send` of `text` into a lane; returns the request id.
    pub async fn send_text(
        &mut self,
        chat: Option<&str>,
        thread: Option<&str>,
        text: &(impl serde::Serialize + ?Sized),
    ) -> i64 {
        self.request("message.send", chat, thread, json!({ "text": text }))
            .await
    }

    /// As [`Client::send_text`] with `auto_thread` set: the default channel may mint a thread.
    pub async fn send_auto_threaded(&mut self, chat: Option<&str>, text: &str) -> i64 {
        self.request(
            "message.send",
            chat,
            None,
            json!({ "text": text, "auto_thread": true }),
        )
        .await
    }

    /// Sends `text` in the default channel and returns every frame that follows, up to and
    /// including the first that `last` accepts. An `error` answering the send fails the test.
    pub async fn say(&mut self, text: &str, mut last: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let id = self
            .request(
                "message.send",
                Some("default"),
                None,
                json!({ "text": text }),
            )
            .await;
        let mut frames = Vec::new();
        loop {
            let f = self.recv().await;
            if frame_type(&f) == "error" && f["id"] == json!(id) {
                panic!("`{text}` (id {id}) was refused: {f}");
            }
            let done = last(&f);
            frames.push(f);
            if done {
                return frames;
            }
        }
    }

    pub fn next_id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Next message of any kind, or `None` when `deadline` passes first. Text frames are
    /// validated and recorded here, so no caller can skip the schema check.
    async fn next_incoming(&mut self, deadline: tokio::time::Instant) -> Option<Incoming> {
        if let Some(closed) = &self.closed {
            return Some(Incoming::Closed(closed.clone()));
        }
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return None,
                Ok(msg) => msg,
            };
            match msg {
                None | Some(Err(_)) => {
                    if let Some(Err(e)) = msg {
                        self.last_error = Some(e.to_string());
                    }
                    // A server close frame is remembered before the stream ends; keep it.
                    let closed = self.closed.get_or_insert(None).clone();
                    return Some(Incoming::Closed(closed));
                }
                Some(Ok(Message::Text(text))) => {
                    assert!(
                        text.len() <= self.max_frame_in,
                        "server sent a {}-byte frame, over the {} an app takes: {}…\n{}",
                        text.len(),
                        self.max_frame_in,
                        text.as_str().chars().take(200).collect::<String>(),
                        self.recent()
                    );
                    let value: Value = serde_json::from_str(text.as_str()).unwrap_or_else(|e| {
                        panic!(
                            "server sent a text frame that is not JSON ({e}): {}",
                            text.as_str()
                        )
                    });
                    if let Err(e) = Schema::load().validate_server_frame(&value) {
                        panic!("{e}\n{}", self.recent());
                    }
                    self.seen.push(value.clone());
                    return Some(Incoming::Text(value));
                }
                Some(Ok(Message::Binary(bytes))) => {
                    let bytes = bytes.to_vec();
                    self.binaries.push(bytes.clone());
                    return Some(Incoming::Binary(bytes));
                }
                Some(Ok(Message::Close(frame))) => {
                    let info = frame.map(|f| (u16::from(f.code), f.reason.as_str().to_owned()));
                    self.closed = Some(info.clone());
                    return Some(Incoming::Closed(info));
                }
                // tungstenite answers pings itself; raw frames never surface on read.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            }
        }
    }

    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.timeout
    }

    /// Next text, binary or close event, bounded by `self.timeout`.
    pub async fn recv_any(&mut self) -> Incoming {
        let deadline = self.deadline();
        match self.next_incoming(deadline).await {
            Some(incoming) => incoming,
            None => panic!("no frame within {:?}\n{}", self.timeout, self.recent()),
        }
    }

    /// Next text frame; binary frames in between are recorded in `binaries` and skipped.
    pub async fn recv(&mut self) -> Value {
        self.recv_until(|_| true).await
    }

    /// First text frame matching `pred`; frames before it are still validated and recorded.
    pub async fn recv_until(&mut self, mut pred: impl FnMut(&Value) -> bool) -> Value {
        let deadline = self.deadline();
        loop {
            match self.next_incoming(deadline).await {
                Some(Incoming::Text(v)) if pred(&v) => return v,
                Some(Incoming::Text(_) | Incoming::Binary(_)) => {}
                Some(Incoming::Closed(info)) => {
                    panic!(
                        "connection closed ({info:?}) while waiting for a frame\n{}",
                        self.recent()
                    )
                }
                None => panic!(
                    "no matching frame within {:?}\n{}",
                    self.timeout,
                    self.recent()
                ),
            }
        }
    }

    pub async fn recv_type(&mut self, frame_type_wanted: &str) -> Value {
        self.recv_until(|f| frame_type(f) == frame_type_wanted)
            .await
    }

    /// The reply carrying request id `id` (whatever its type).
    pub async fn recv_reply(&mut self, id: i64) -> Value {
        self.recv_until(|f| f.get("id").and_then(Value::as_i64) == Some(id))
            .await
    }

    /// The message ids a search over every channel finds (up to 100), newest first.
    pub async fn search_ids(&mut self, query: &str) -> Vec<String> {
        let id = self
            .request(
                "search",
                None,
                None,
                json!({ "query": query, "limit": 100 }),
            )
            .await;
        let r = self.recv_reply(id).await;
        assert_eq!(frame_type(&r), "search.results", "search `{query}`: {r}");
        r["payload"]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["message_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The newest `limit` messages of a channel's flat lane (the default channel's with
    /// `None`), oldest first.
    pub async fn newest_messages(&mut self, chat: Option<&str>, limit: usize) -> Vec<Value> {
        let id = self
            .request("history", chat, None, json!({ "limit": limit }))
            .await;
        let r = self.recv_reply(id).await;
        assert_eq!(frame_type(&r), "history", "{r}");
        r["payload"]["messages"].as_array().unwrap().clone()
    }

    /// The next `error` frame, asserting its code.
    pub async fn expect_error(&mut self, code: &str) -> Value {
        let err = self.recv_type("error").await;
        let got = err.pointer("/payload/code").and_then(Value::as_str);
        assert_eq!(
            got,
            Some(code),
            "unexpected error frame: {err}\n{}",
            self.recent()
        );
        err
    }

    /// Waits for the server to end the connection; frames before that are validated and
    /// recorded. Returns the close code, or `None` on EOF/reset without a close frame.
    pub async fn expect_closed(&mut self) -> Option<u16> {
        let deadline = self.deadline();
        loop {
            match self.next_incoming(deadline).await {
                Some(Incoming::Closed(info)) => return info.map(|(code, _)| code),
                Some(_) => {}
                None => panic!(
                    "server did not close the connection within {:?}\n{}",
                    self.timeout,
                    self.recent()
                ),
            }
        }
    }

    /// Asserts nothing (text, binary or close) arrives within `quiet`.
    pub async fn assert_silent(&mut self, quiet: Duration) {
        let deadline = tokio::time::Instant::now() + quiet;
        if let Some(incoming) = self.next_incoming(deadline).await {
            panic!(
                "expected silence for {quiet:?}, got {incoming:?}\n{}",
                self.recent()
            );
        }
    }

    /// Every text frame that arrives until the connection has been quiet for `quiet`
    /// (bounded overall by `self.timeout`).
    pub async fn collect_quiet(&mut self, quiet: Duration) -> Vec<Value> {
        let overall = self.deadline();
        let mut frames = Vec::new();
        loop {
            let deadline = (tokio::time::Instant::now() + quiet).min(overall);
            match self.next_incoming(deadline).await {
                Some(Incoming::Text(v)) => frames.push(v),
                Some(Incoming::Binary(_)) => {}
                Some(Incoming::Closed(_)) | None => return frames,
            }
        }
    }

    /// The next text frame if one arrives before `deadline` (binary frames skipped), else
    /// `None`: for a client that keeps sending while it reads.
    pub async fn recv_before(&mut self, deadline: tokio::time::Instant) -> Option<Value> {
        loop {
            match self.next_incoming(deadline).await {
                Some(Incoming::Text(v)) => return Some(v),
                Some(Incoming::Binary(_)) => {}
                Some(Incoming::Closed(info)) => {
                    panic!("connection closed ({info:?})\n{}", self.recent())
                }
                None => return None,
            }
        }
    }

    /// Sends a normal close and waits (bounded) for the server's answer.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(self.timeout, self.ws.close(None)).await;
        let deadline = self.deadline();
        while let Some(incoming) = self.next_incoming(deadline).await {
            if matches!(incoming, Incoming::Closed(_)) {
                break;
            }
        }
    }

    pub fn seen_types(&self) -> Vec<String> {
        self.seen.iter().map(|f| frame_type(f).to_owned()).collect()
    }

    /// The last frames seen, for panic messages.
    pub fn recent(&self) -> String {
        let start = self.seen.len().saturating_sub(SHOWN_FRAMES);
        let mut out = format!(
            "last {} of {} frames seen ({} binary):",
            self.seen.len() - start,
            self.seen.len(),
            self.binaries.len()
        );
        for f in &self.seen[start..] {
            out.push_str("\n  ");
            out.push_str(&f.to_string());
        }
        if let Some(closed) = &self.closed {
            out.push_str(&format!("\n  connection closed: {closed:?}"));
        }
        out
    }
}

/// `frame.type`, or "" when absent (only possible for frames that never passed validation).
pub fn frame_type(frame: &Value) -> &str {
    frame.get("type").and_then(Value::as_str).unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// Shared test helpers (identical copies used to live in several test files)
// ---------------------------------------------------------------------------------------------

/// `payload.<key>` as a string, or "" when absent: terse field access for assertions.
pub fn pstr<'a>(f: &'a Value, key: &str) -> &'a str {
    f.pointer(&format!("/payload/{key}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The envelope `id` (request id echoed on replies), if any.
pub fn id_of(f: &Value) -> Option<i64> {
    f.get("id").and_then(Value::as_i64)
}

/// The envelope `cursor` (present on outbox replay only), if any.
pub fn cursor_of(f: &Value) -> Option<u64> {
    f.get("cursor").and_then(Value::as_u64)
}

/// `hello.ack`'s `sync_cursor`, which every ack must carry.
pub fn sync_cursor(ack: &Value) -> u64 {
    ack.pointer("/payload/sync_cursor")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("hello.ack without an integer sync_cursor: {ack}"))
}

/// Frames one per line, indented, for panic messages.
pub fn dump(frames: &[Value]) -> String {
    frames
        .iter()
        .map(|f| format!("  {f}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The gateway's own answer to a command: a `message` with role `system`.
pub fn system_answer(f: &Value) -> bool {
    frame_type(f) == "message" && f["payload"]["role"] == "system"
}

/// `typing{on:false}`: the frame that ends a turn.
pub fn typing_off(f: &Value) -> bool {
    frame_type(f) == "typing" && f["payload"]["on"] == json!(false)
}

// The ways into a session, from the bare socket up. A greeting is `hello.ack` then `status`,
// queued together (nothing can come between them), so every `connect*` reads `status` as the
// very next frame.

/// Hello as a paired device; returns the client and `hello.ack`, the greeting left unread.
pub async fn hello_paired(gw: &Gateway, p: &Paired) -> (Client, Value) {
    Client::hello(&gw.url, &p.token, &p.device_id).await
}

/// As [`hello_paired`] with extra `hello` payload fields (e.g. `ntfy_topic`); a refusal fails
/// the test with the gateway's output.
pub async fn hello_paired_with(gw: &Gateway, p: &Paired, extra: Value) -> (Client, Value) {
    let mut c = Client::open(&gw.url).await;
    let id = c.next_id();
    let mut payload =
        json!({ "token": p.token, "device_id": p.device_id, "device_name": "iris-test" });
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            payload[k] = v;
        }
    }
    c.send(json!({ "v": 1, "type": "hello", "id": id, "payload": payload }))
        .await;
    let ack = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(
        frame_type(&ack),
        "hello.ack",
        "hello refused: {ack}\n{}",
        gw.output_tail()
    );
    (c, ack)
}

/// Reads the `status` that must follow `hello.ack` at once.
async fn greeting_status(c: &mut Client) -> Value {
    let status = c.recv().await;
    assert_eq!(
        frame_type(&status),
        "status",
        "expected status after hello.ack: {status}"
    );
    status
}

/// Hello as a paired device and read the greeting through `status`: (client, ack, status).
pub async fn connect_with_status(gw: &Gateway, p: &Paired) -> (Client, Value, Value) {
    let (mut c, ack) = hello_paired(gw, p).await;
    let status = greeting_status(&mut c).await;
    (c, ack, status)
}

/// As [`connect_with_status`], without the `status` frame.
pub async fn connect(gw: &Gateway, p: &Paired) -> (Client, Value) {
    let (c, ack, _status) = connect_with_status(gw, p).await;
    (c, ack)
}

/// As [`connect`], with extra `hello` payload fields.
pub async fn connect_with(gw: &Gateway, p: &Paired, extra: Value) -> (Client, Value) {
    let (mut c, ack) = hello_paired_with(gw, p, extra).await;
    greeting_status(&mut c).await;
    (c, ack)
}

/// As [`connect`], asserting the greeting reports the agent `online`.
pub async fn connect_online(gw: &Gateway, p: &Paired) -> (Client, Value) {
    let (c, ack, status) = connect_with_status(gw, p).await;
    assert_eq!(status["payload"]["state"], "online", "{status}");
    (c, ack)
}

/// As [`connect`], then waits (bounded by `timeout`, which the client keeps for its later
/// calls) for a `status` reporting the agent `online`: for agents that start up slowly.
pub async fn connect_awaiting_online(gw: &Gateway, p: &Paired, timeout: Duration) -> Client {
    let (mut c, _, status) = connect_with_status(gw, p).await;
    c.timeout = timeout;
    if status["payload"]["state"] != "online" {
        c.recv_until(|f| frame_type(f) == "status" && f["payload"]["state"] == "online")
            .await;
    }
    c
}

/// `channel.list` round trip; returns the directory's entries.
pub async fn channel_list(c: &mut Client) -> Vec<Value> {
    let id = c.request("channel.list", None, None, json!({})).await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.list", "{r}");
    r["payload"]["channels"]
        .as_array()
        .expect("channels")
        .clone()
}

/// The demo agent's reply as the behaviour contract words it.
/// The values a `picker.choice` offers, in order.
pub fn picker_values(picker: &Value) -> Vec<String> {
    picker["payload"]["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["value"].as_str().unwrap_or("").to_owned())
        .collect()
}

pub fn demo_reply(text: &str) -> String {
    let words = text.split_whitespace().count();
    let chars = text.chars().count();
    let quoted: String = text.chars().take(200).collect();
    format!(
        "You said: \u{201c}{quoted}\u{201d}. That is {words} word{} and {chars} character{}. I am the demo agent; connect a Hermes agent for real answers.",
        if words == 1 { "" } else { "s" },
        if chars == 1 { "" } else { "s" },
    )
}

/// Creates a channel (or, with a parent, a thread) and returns its chat id; the reply must be
/// `channel.created` carrying one.
async fn create_entry(c: &mut Client, payload: Value) -> String {
    let id = c.request("channel.create", None, None, payload).await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.created", "{r}");
    r["payload"]["chat_id"]
        .as_str()
        .unwrap_or_else(|| panic!("channel.created without chat_id: {r}"))
        .to_owned()
}

/// `channel.create` of a plain channel.
pub async fn create_channel(c: &mut Client, name: &str) -> String {
    create_entry(c, serde_json::json!({ "name": name, "kind": "channel" })).await
}

/// `channel.create` of a thread under `parent`.
pub async fn create_thread(c: &mut Client, parent: &str, name: &str) -> String {
    create_entry(
        c,
        serde_json::json!({ "name": name, "kind": "thread", "parent_chat_id": parent }),
    )
    .await
}

/// Every lane's history as a device sees it, by the entry's chat id (a thread by its own id),
/// one page of up to 200 messages each.
pub async fn lane_histories(
    c: &mut Client,
    channels: &[Value],
) -> std::collections::BTreeMap<String, Vec<Value>> {
    let mut history = std::collections::BTreeMap::new();
    for ch in channels {
        let chat = ch["chat_id"].as_str().unwrap().to_owned();
        let (lane_chat, lane_thread) = match ch["parent_chat_id"].as_str() {
            Some(parent) => (parent.to_owned(), Some(chat.clone())),
            None => (chat.clone(), None),
        };
        let id = c
            .request(
                "history",
                Some(&lane_chat),
                lane_thread.as_deref(),
                json!({ "limit": 200 }),
            )
            .await;
        let r = c.recv_reply(id).await;
        assert_eq!(frame_type(&r), "history", "{r}");
        history.insert(chat, r["payload"]["messages"].as_array().unwrap().clone());
    }
    history
}

/// `sync` from `cursor`: every replayed frame (those carrying a cursor), and the head
/// `sync.done` reports.
pub async fn sync_from(c: &mut Client, cursor: u64) -> (Vec<Value>, u64) {
    let id = c
        .request("sync", None, None, json!({ "cursor": cursor }))
        .await;
    let mut replayed = Vec::new();
    loop {
        let f = c.recv().await;
        if id_of(&f) == Some(id) {
            let head = f["payload"]["cursor"].as_u64().expect("sync.done cursor");
            return (replayed, head);
        }
        if f.get("cursor").is_some() {
            replayed.push(f);
        }
    }
}

/// Lower-case hex SHA-256 of `bytes`: the `sha256` an upload declares, and the name of the blob
/// the gateway stores it under.
pub fn sha_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Sends a message and waits for its receipt and the end of its demo turn, retrying while the
/// frame rate limit refuses it; returns the user message id.
pub async fn send_until_stop(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    text: &str,
) -> String {
    loop {
        let id = c.send_text(chat, thread, text).await;
        let r = c.recv_reply(id).await;
        if pstr(&r, "code") == "rate_limited" {
            tokio::time::sleep(Duration::from_millis(150)).await;
            continue;
        }
        assert_eq!(frame_type(&r), "read.receipt", "{r}");
        c.recv_type("message.stop").await;
        return pstr(&r, "message_id").to_owned();
    }
}

/// Uploads `data` as the PNG `garden.png` under `media_ref`, in 64 KiB binary frames; the
/// upload must be taken and its checksum accepted.
pub async fn upload_png(c: &mut Client, media_ref: &str, data: &[u8]) {
    upload_file(c, media_ref, "image", "image/png", "garden.png", data).await;
}

/// Uploads `data` under `media_ref` as a file of this kind, mime and name; the upload must be
/// taken.
pub async fn upload_file(
    c: &mut Client,
    media_ref: &str,
    kind: &str,
    mime: &str,
    filename: &str,
    data: &[u8],
) {
    let start = c
        .request(
            "media.upload.start",
            None,
            None,
            json!({ "media_ref": media_ref, "kind": kind, "mime": mime, "size": data.len(), "filename": filename }),
        )
        .await;
    for piece in data.chunks(64 * 1024) {
        c.send_raw_binary(piece.to_vec()).await;
    }
    let end = c
        .request(
            "media.upload.end",
            None,
            None,
            json!({ "media_ref": media_ref, "sha256": sha_hex(data) }),
        )
        .await;
    let ack = c.recv_reply(end).await;
    assert!(
        c.seen.iter().all(|f| id_of(f) != Some(start)),
        "upload refused: {}",
        c.recent()
    );
    assert_eq!(ack["payload"]["ok"], json!(true), "{ack}");
}

/// The next answer in the lane: a `message.stop`, or the assistant `message` a restart's
/// recovery sends instead; the frame and its text.
pub async fn recv_answer(c: &mut Client) -> (Value, String) {
    let answer = c
        .recv_until(|f| {
            frame_type(f) == "message.stop"
                || (frame_type(f) == "message" && f["payload"]["role"] == "assistant")
        })
        .await;
    let text = answer["payload"]["final_text"]
        .as_str()
        .or(answer["payload"]["text"].as_str())
        .unwrap_or("")
        .to_owned();
    (answer, text)
}

/// `media.pull` of a stored file: its bytes, through `media.pull.end`.
pub async fn pull_media(c: &mut Client, media_id: &str) -> Vec<u8> {
    let rid = c
        .request("media.pull", None, None, json!({ "media_id": media_id }))
        .await;
    let mut bytes = Vec::new();
    loop {
        match c.recv_any().await {
            Incoming::Binary(b) => bytes.extend(b),
            Incoming::Text(f) if id_of(&f) == Some(rid) => {
                assert_eq!(frame_type(&f), "media.pull.end", "{f}");
                return bytes;
            }
            Incoming::Text(_) => {}
            other => panic!("pull: {other:?}"),
        }
    }
}

/// Starts `run` with the config file `config` on a fresh data dir and expects a refusal: its
/// stderr (the start's message).
pub fn refused_start(config: &Path) -> String {
    let data = temp_data_dir();
    let out = cli_os(&[
        OsStr::new("run"),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data-dir".as_ref(),
        data.path().as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
    ]);
    assert!(!out.status.success(), "{} was accepted", config.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs the command line with `args`: (succeeded, stdout, stderr).
pub fn cli_run(args: &[&OsStr]) -> (bool, String, String) {
    let out = cli_os(args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `iris-gateway backup FILE --data-dir DATA`: (succeeded, stdout, stderr).
pub fn cli_backup(file: &Path, data: &Path) -> (bool, String, String) {
    cli_run(&[
        "backup".as_ref(),
        file.as_os_str(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ])
}

/// `iris-gateway restore FILE --data-dir DATA`: (succeeded, stdout, stderr).
pub fn cli_restore(file: &Path, data: &Path) -> (bool, String, String) {
    cli_run(&[
        "restore".as_ref(),
        file.as_os_str(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ])
}

/// Percent-decoding written here, not borrowed from the gateway, so the test checks the format.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii escape");
            out.push(u8::from_str_radix(hex, 16).expect("hex escape"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("utf-8 value")
}

/// `iris://pair?url=…&token=…&fp=…` → its fields, decoded; every value must be
/// percent-encoded as the pairing URI promises.
pub fn parse_pairing_uri(uri: &str) -> std::collections::HashMap<String, String> {
    let query = uri
        .strip_prefix("iris://pair?")
        .unwrap_or_else(|| panic!("not a pairing URI: {uri}"));
    query
        .split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            assert!(
                v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)),
                "value of {k} is not percent-encoded: {v}"
            );
            (k.to_owned(), percent_decode(v))
        })
        .collect()
}

/// `len` pseudo-random letters and digits (a fixed sequence): text zstd cannot shrink much,
/// for values that must stay over sled's 128 KiB threshold for a file of their own once
/// compressed.
pub fn noise(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// The answer to one raw HTTP/1.1 exchange: status, headers (names lower-cased, in order) and
/// the body as text.
pub struct RawHttp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Writes `request` (a whole HTTP/1.1 request with `Connection: close`) on `tcp` and reads the
/// answer to the close, within `within`.
pub async fn raw_http(mut tcp: TcpStream, request: &str, within: Duration) -> RawHttp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(within, tcp.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawHttp {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Lays `over` onto `base`: an object is merged key by key into the object at the same place,
/// anything else replaces what is there (`protocol/extensions-v1.json` says the same).
pub fn lay_over(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => lay_over(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}
