//! Running as a systemd service: the unit and sysusers files pass systemd's own checks (the
//! update helper's path unit, service and boot-time recovery too, and they name the paths the
//! `[update]` defaults and the helper use), the
//! real binary speaks sd_notify (READY=1 once it listens, WATCHDOG=1 at half the interval,
//! STOPPING=1 on SIGTERM) over a datagram socket standing in for systemd's, and
//! `iris-gateway config` prints the shipped, commented config file, which loads as the defaults
//! and names every key.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bin_display, cli, gateway_command, temp_data_dir, BIN};
use iris_gateway::config::{Config, UpdateConfig};
use iris_gateway::update::{helper, journal, stage};

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/iris-gateway.service");
const UPDATE_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/systemd/iris-gateway-update.path"
);
const UPDATE_UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/systemd/iris-gateway-update.service"
);
const RECOVER_UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/systemd/iris-gateway-update-recover.service"
);
const SYSUSERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/iris-gateway.sysusers");
const SHIPPED_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/config.toml");
/// Config sections whose commented defaults are written by the engineer adding them (`[led]`:
/// the status LED); see `config_template_names_every_setting`.
const PENDING_SECTIONS: &[&str] = &["led"];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A systemd tool on PATH. Missing is a failure, not a skip: without it the unit is unchecked.
fn systemd_tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH: install systemd (`apt-get install systemd`; the CI script \
             installs it) so the unit in systemd/ can be checked"
        )
    })
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// Lines of a tool's output that report a problem with our files.
fn complaints(output: &str, about: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| {
            l.contains(about)
                || ["Unknown", "Failed", "ignoring", "not valid", "Invalid"]
                    .iter()
                    .any(|w| l.contains(w))
        })
        .map(str::to_owned)
        .collect()
}

/// The shipped config template with `#key = value` lines uncommented: all of them, or only
/// those showing a default (not the ones after `# Example:`).
fn uncommented(template: &str, with_examples: bool) -> String {
    let mut out = String::new();
    let mut previous = "";
    for line in template.lines() {
        let is_example = previous.trim() == "# Example:";
        match key_line(line) {
            Some(_) if with_examples || !is_example => out.push_str(&line[1..]),
            _ => out.push_str(line),
        }
        out.push('\n');
        previous = line;
    }
    out
}

/// `key` for a `#key = value` or `key = value` line.
fn key_line(line: &str) -> Option<&str> {
    let body = line.strip_prefix('#').unwrap_or(line);
    let (key, _) = body.split_once(" = ")?;
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    ok.then_some(key)
}

/// `section.key` for every setting the template shows (top-level keys have no section).
fn template_keys(template: &str) -> BTreeSet<String> {
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in template.lines() {
        // Lists of tables (`[[cron]]`) have no default entries: the template shows each as a
        // commented example block, which names the setting.
        if let Some(name) = line.strip_prefix("# [[").and_then(|l| l.strip_suffix("]]")) {
            keys.insert(name.to_owned());
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = format!("{name}.");
        } else if let Some(key) = key_line(line) {
            let full = format!("{section}{key}");
            assert!(keys.insert(full.clone()), "{full} appears twice");
        }
    }
    keys
}

/// `section.key` for every leaf field of `Config`, from its pretty `Debug` output (Config
/// derives only `Deserialize`; its Debug still names every field, nesting by indentation).
fn config_keys(config: &Config) -> BTreeSet<String> {
    let debug = format!("{config:#?}");
    let mut path: Vec<String> = Vec::new();
    let mut keys = BTreeSet::new();
    for line in debug.lines().skip(1) {
        let trimmed = line.trim();
        if trimmed == "}" || trimmed == "}," {
            path.pop();
            continue;
        }
        let Some((name, value)) = trimmed.split_once(": ") else {
            continue;
        };
        if value.ends_with('{') {
            path.push(name.to_owned());
        } else {
            let mut full = path.join(".");
            if !full.is_empty() {
                full.push('.');
            }
            full.push_str(name);
            keys.insert(full);
        }
    }
    keys
}

/// The running gateway under a fake systemd: everything it sends to NOTIFY_SOCKET, in order.
struct Notified {
    child: Child,
    rx: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Notified {
    /// Starts `run` on `addr` with NOTIFY_SOCKET pointing at a socket of ours and the given
    /// watchdog variables.
    fn start(addr: SocketAddr, watchdog_usec: &str, watchdog_pid: Option<&str>) -> Notified {
        let dir = temp_data_dir();
        let socket_path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&socket_path)
            .unwrap_or_else(|e| panic!("bind {}: {e}", socket_path.display()));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if tx.send((Instant::now(), text)).is_err() {
                    break;
                }
            }
        });

        let mut cmd = gateway_command();
        cmd.arg("run")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen", &addr.to_string(), "--demo-pace-ms", "0"])
            .env("NOTIFY_SOCKET", &socket_path)
            .env("WATCHDOG_USEC", watchdog_usec)
            .env_remove("WATCHDOG_PID")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(pid) = watchdog_pid {
            cmd.env("WATCHDOG_PID", pid);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", bin_display()));
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let mut pipe = child.stderr.take().expect("piped stderr");
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&chunk[..n]);
                    stderr.lock().expect("stderr buffer").push_str(&text);
                }
            });
        }
        Notified {
            child,
            rx,
            seen: Vec::new(),
            stderr,
            _dir: dir,
        }
    }

    /// The next datagram containing the assignment `line` (e.g. `READY=1`), within `timeout`.
    fn expect(&mut self, line: &str, timeout: Duration) -> (Instant, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((at, msg)) => {
                    self.seen.push(msg.clone());
                    if msg.lines().any(|l| l == line) {
                        return (at, msg);
                    }
                }
                Err(_) => panic!(
                    "no `{line}` from the gateway within {timeout:?} (does server.rs call \
                     service::Notifier?){}",
                    self.context()
                ),
            }
        }
    }

    /// Every datagram that arrives within `window`.
    fn collect(&mut self, window: Duration) -> Vec<(Instant, String)> {
        let deadline = Instant::now() + window;
        let mut got = Vec::new();
        while let Ok(item) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(item.1.clone());
            got.push(item);
        }
        got
    }

    fn sigterm(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, not yet reaped; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "gateway did not exit within {timeout:?} of SIGTERM{}",
                    self.context()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn context(&self) -> String {
        format!(
            "\nnotifications so far: {:?}\n--- gateway stderr ---\n{}",
            self.seen,
            self.stderr.lock().expect("stderr buffer")
        )
    }
}

impl Drop for Notified {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address with a port that was free a moment ago: the test must know the port
/// before the gateway starts, to check that it listens at the moment it says READY=1.
fn free_addr() -> SocketAddr {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    probe.local_addr().expect("probe address")
}

// ---------------------------------------------------------------------------------------------
// The unit and the sysusers entry
// ---------------------------------------------------------------------------------------------

#[test]
fn unit_passes_systemd_analyze_verify() {
    let analyze = systemd_tool("systemd-analyze");
    let unit = read(UNIT);
    let shipped = "ExecStart=/usr/bin/iris-gateway run --config /etc/iris-gateway/config.toml\n";
    assert_eq!(
        unit.matches(shipped).count(),
        1,
        "the unit must start /usr/bin/iris-gateway with the shipped config, once:\n{unit}"
    );
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30",
        "StateDirectory=iris-gateway",
        "User=iris-gateway",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "the unit lacks `{line}`:\n{unit}"
        );
    }

    // verify checks that ExecStart names an executable; point it at the binary under test.
    let dir = temp_data_dir();
    let copy = dir.path().join("iris-gateway.service");
    let here = format!("ExecStart={BIN} run --config /etc/iris-gateway/config.toml\n");
    std::fs::write(&copy, unit.replace(shipped, &here)).expect("write the unit copy");

    let out = Command::new(&analyze)
        .args(["verify", "--man=no", "--generators=no"])
        .arg(&copy)
        .output()
        .expect("run systemd-analyze verify");
    let said = stdout_and_stderr(&out);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed ({}):\n{said}",
        out.status
    );
    let bad = complaints(&said, "iris-gateway.service");
    assert!(
        bad.is_empty(),
        "systemd-analyze verify complains about the unit:\n{}",
        bad.join("\n")
    );
}

/// The update helper's three units, checked by `systemd-analyze verify` together with the
/// gateway's unit (which they order themselves against), with `/usr/bin/iris-gateway` pointed at
/// the binary under test.
#[test]
fn update_units_pass_systemd_analyze_verify() {
    let analyze = systemd_tool("systemd-analyze");
    let dir = temp_data_dir();
    let mut copies = Vec::new();
    for path in [UNIT, UPDATE_PATH, UPDATE_UNIT, RECOVER_UNIT] {
        let name = Path::new(path).file_name().expect("a unit file name");
        let copy = dir.path().join(name);
        let text = read(path).replace(
            "ExecStart=/usr/bin/iris-gateway ",
            &format!("ExecStart={BIN} "),
        );
        std::fs::write(&copy, text).expect("write the unit copy");
        copies.push(copy);
    }
    let out = Command::new(&analyze)
        .args(["verify", "--man=no", "--generators=no"])
        .args(&copies)
        .output()
        .expect("run systemd-analyze verify");
    let said = stdout_and_stderr(&out);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed ({}):\n{said}",
        out.status
    );
    let bad: Vec<String> = [
        "iris-gateway-update.path",
        "iris-gateway-update.service",
        "iris-gateway-update-recover.service",
    ]
    .iter()
    .flat_map(|name| complaints(&said, name))
    .collect();
    assert!(
        bad.is_empty(),
        "systemd-analyze verify complains about the update units:\n{}",
        bad.join("\n")
    );
}

/// The `Key=value` lines of a unit's section, in order.
fn unit_lines<'a>(unit: &'a str, section: &str) -> Vec<&'a str> {
    let mut inside = false;
    let mut lines = Vec::new();
    for line in unit.lines() {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
        } else if inside && !line.starts_with('#') && line.contains('=') {
            lines.push(line);
        }
    }
    lines
}

#[test]
fn update_units_name_the_paths_the_helper_uses() {
    let defaults = UpdateConfig::default();
    let data_dir = "/var/lib/iris-gateway";
    let helper_dir = defaults.helper_dir.display().to_string();
    let args = format!("update apply --config /etc/iris-gateway/config.toml --data-dir {data_dir}");

    // The path unit waits for the file the gateway writes last, and starts the helper.
    let path = read(UPDATE_PATH);
    let trigger = format!(
        "PathExists={data_dir}/{}/{}",
        stage::STAGE_DIR,
        stage::STAGED_REQUEST
    );
    for line in [
        trigger.as_str(),
        "Unit=iris-gateway-update.service",
        "WantedBy=paths.target",
    ] {
        assert!(
            path.lines().any(|l| l == line),
            "the path unit lacks `{line}`:\n{path}"
        );
    }

    // The helper: root, one shot, the shipped config, never enabled on its own.
    let unit = read(UPDATE_UNIT);
    let service = unit_lines(&unit, "Service");
    let exec = format!("ExecStart={} {args}", defaults.binary.display());
    for line in [
        exec.as_str(),
        "Type=oneshot",
        "After=iris-gateway-update-recover.service",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "the helper's unit lacks `{line}`:\n{unit}"
        );
    }
    assert!(
        !service
            .iter()
            .any(|l| l.starts_with("User=") || l.starts_with("DynamicUser=")),
        "the helper must run as root (it replaces /usr/bin/iris-gateway)"
    );
    assert!(
        unit_lines(&unit, "Install").is_empty(),
        "the helper is started by its path unit only: no [Install] section"
    );
    // Long enough for the longest health window, the store's copy and a stop and a start.
    let timeout = service
        .iter()
        .find_map(|l| l.strip_prefix("TimeoutStartSec="))
        .and_then(|v| v.strip_suffix("min"))
        .and_then(|m| m.parse::<u64>().ok())
        .expect("TimeoutStartSec=<minutes>min in the helper's unit");
    assert!(
        timeout * 60 >= defaults.max_window_secs + 2 * 120 + 300,
        "TimeoutStartSec={timeout}min is too short for a {} s health window",
        defaults.max_window_secs
    );
    // It may write exactly where the update happens, under ProtectSystem=strict.
    let binary_dir = defaults
        .binary
        .parent()
        .expect("the binary's directory")
        .display()
        .to_string();
    let writable = format!("ReadWritePaths={binary_dir} {data_dir} {helper_dir}");
    for unit_text in [&unit, &read(RECOVER_UNIT)] {
        for line in [
            "ProtectSystem=strict",
            writable.as_str(),
            "NoNewPrivileges=yes",
        ] {
            assert!(
                unit_text.lines().any(|l| l == line),
                "an update unit lacks `{line}`:\n{unit_text}"
            );
        }
    }

    // The recovery: only while a journal exists, before the gateway, never restarting it, and
    // wanted by the boot, not by the gateway (which the helper starts during a trial).
    let recover = read(RECOVER_UNIT);
    let condition = format!("ConditionPathExists={helper_dir}/{}", journal::JOURNAL_FILE);
    for line in [
        condition.as_str(),
        "Before=iris-gateway.service",
        "Type=oneshot",
        "WantedBy=multi-user.target",
    ] {
        assert!(
            recover.lines().any(|l| l == line),
            "the recovery unit lacks `{line}`:\n{recover}"
        );
    }
    assert!(
        !recover
            .lines()
            .any(|l| l.starts_with("ExecStart=") && l.contains("--restart")),
        "the recovery must not stop or start the gateway"
    );
    let gateway = read(UNIT);
    assert!(
        !gateway.contains("iris-gateway-update"),
        "the gateway's unit must not pull in the update units: starting the gateway during a \
         trial would run the recovery"
    );
    assert!(
        recover.contains(&format!("{helper_dir}/{}", helper::PREVIOUS_BINARY)),
        "the recovery must run from the previous binary while it exists"
    );
}

/// A unit's `KEY=/bin/sh -c '…'` line as the shell gets it (systemd turns `$$` into `$`), with
/// the previous binary and /usr/bin/iris-gateway replaced by scripts in `dir` that print who
/// they are and their arguments; returns the script and the two stand-ins.
fn shell_line_with_stand_ins(
    unit: &str,
    key: &str,
    dir: &std::path::Path,
) -> (String, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let exec = read(unit)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=/bin/sh -c '")))
        .and_then(|l| l.strip_suffix('\''))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{key}=/bin/sh -c '…' in {unit}"));
    let fake = |name: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho {name} \"$@\"\n"))
            .expect("write a fake binary");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    };
    let previous = fake("previous");
    let installed = fake("installed");
    let script = exec
        .replace("$$", "$")
        .replace(
            &format!(
                "{}/{}",
                UpdateConfig::default().helper_dir.display(),
                helper::PREVIOUS_BINARY
            ),
            &previous.display().to_string(),
        )
        .replace("/usr/bin/iris-gateway", &installed.display().to_string());
    (script, previous, installed)
}

/// Runs a unit's shell line with `env`; what it printed.
fn run_shell(script: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .envs(env.iter().copied())
        .output()
        .expect("run /bin/sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The recovery's ExecStart picks the previous binary while it is there and executable, else
/// /usr/bin/iris-gateway, and passes both the same arguments: run through /bin/sh with the two
/// paths replaced by scripts that say who they are.
#[test]
fn recovery_runs_from_the_previous_binary_while_it_exists() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_data_dir();
    let (script, previous, _) = shell_line_with_stand_ins(RECOVER_UNIT, "ExecStart", dir.path());
    let run = || run_shell(&script, &[]);
    let args =
        "update recover --config /etc/iris-gateway/config.toml --data-dir /var/lib/iris-gateway";
    assert_eq!(run(), format!("previous {args}"));
    // Not executable (a copy cut short): the installed binary.
    std::fs::set_permissions(&previous, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(run(), format!("installed {args}"));
    std::fs::remove_file(&previous).expect("remove");
    assert_eq!(run(), format!("installed {args}"));
}

/// The helper unit's ExecStopPost recovers, with a restart and from the previous binary, only
/// when the helper ended other than in success while its journal exists.
#[test]
fn a_helper_that_died_is_recovered_by_its_unit() {
    let dir = temp_data_dir();
    let (script, _, _) = shell_line_with_stand_ins(UPDATE_UNIT, "ExecStopPost", dir.path());
    let journal = dir.path().join("journal.json");
    let script = script.replace(
        &format!(
            "{}/journal.json",
            UpdateConfig::default().helper_dir.display()
        ),
        &journal.display().to_string(),
    );
    let args = "update recover --restart --config /etc/iris-gateway/config.toml --data-dir \
                /var/lib/iris-gateway";
    // Nothing under way: nothing to do, however the helper ended.
    assert_eq!(run_shell(&script, &[("SERVICE_RESULT", "signal")]), "");
    std::fs::write(&journal, "{}").unwrap();
    assert_eq!(run_shell(&script, &[("SERVICE_RESULT", "success")]), "");
    for result in ["signal", "exit-code", "timeout", "core-dump"] {
        assert_eq!(
            run_shell(&script, &[("SERVICE_RESULT", result)]),
            format!("previous {args}"),
            "SERVICE_RESULT={result}"
        );
    }
}

/// What a systemd tool said, on either stream.
fn stdout_and_stderr(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn sysusers_entry_creates_the_service_user() {
    let sysusers = systemd_tool("systemd-sysusers");
    // --root: a dry run against an empty tree, whatever users this machine has.
    let root = temp_data_dir();
    let out = Command::new(&sysusers)
        .arg(format!("--root={}", root.path().display()))
        .arg("--dry-run")
        .arg(SYSUSERS)
        .output()
        .expect("run systemd-sysusers");
    let said = stdout_and_stderr(&out);
    assert!(
        out.status.success(),
        "systemd-sysusers failed ({}):\n{said}",
        out.status
    );
    let bad = complaints(&said, "iris-gateway.sysusers");
    assert!(bad.is_empty(), "systemd-sysusers complains:\n{said}");
    assert!(
        said.contains("Creating user 'iris-gateway'"),
        "no iris-gateway user would be created:\n{said}"
    );
}

// ---------------------------------------------------------------------------------------------
// sd_notify from the real binary
// ---------------------------------------------------------------------------------------------

#[test]
fn notifies_ready_watchdog_and_stopping() {
    let addr = free_addr();
    let mut gw = Notified::start(addr, "2000000", None);

    let (ready_at, ready) = gw.expect("READY=1", Duration::from_secs(20));
    // READY=1 is a promise that phones can connect: the listener must already be bound.
    if let Err(e) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        panic!(
            "READY=1 arrived but {addr} does not accept connections: {e}{}",
            gw.context()
        );
    }
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=")),
        "READY=1 should come with a STATUS= line: {ready:?}"
    );

    // WATCHDOG_USEC=2 s: a ping every second, counted from READY=1 on.
    let later = gw.collect(Duration::from_millis(3200));
    let pings: Vec<Instant> = later
        .iter()
        .filter(|(_, msg)| msg.lines().any(|l| l == "WATCHDOG=1"))
        .map(|(at, _)| *at)
        .collect();
    assert!(
        pings.len() >= 2,
        "expected at least 2 WATCHDOG=1 within 3.2 s of READY=1 with WATCHDOG_USEC=2000000, got {}{}",
        pings.len(),
        gw.context()
    );
    let mut previous = ready_at;
    for at in &pings {
        assert!(
            at.duration_since(previous) < Duration::from_millis(1900),
            "watchdog pings must come at about half the interval (1 s), got a gap of {:?}",
            at.duration_since(previous)
        );
        previous = *at;
    }

    gw.sigterm();
    gw.expect("STOPPING=1", Duration::from_secs(10));
    let status = gw.wait_exit(Duration::from_secs(10));
    assert!(
        status.success(),
        "gateway exited with {status} after SIGTERM{}",
        gw.context()
    );
}

#[test]
fn watchdog_for_another_process_is_ignored() {
    // sd_watchdog_enabled(3): WATCHDOG_PID naming another process means the watchdog is not
    // ours (we inherited it), so no pings; READY=1 still goes out.
    let mut gw = Notified::start(free_addr(), "2000000", Some("1"));
    gw.expect("READY=1", Duration::from_secs(20));
    let later = gw.collect(Duration::from_millis(2500));
    assert!(
        !later
            .iter()
            .any(|(_, msg)| msg.lines().any(|l| l == "WATCHDOG=1")),
        "pinged a watchdog that belongs to PID 1{}",
        gw.context()
    );
    gw.sigterm();
    gw.expect("STOPPING=1", Duration::from_secs(10));
    gw.wait_exit(Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------------------
// `iris-gateway config` and the shipped config file
// ---------------------------------------------------------------------------------------------

#[test]
fn config_command_prints_the_shipped_file() {
    let out = cli(&["config"]);
    assert!(
        out.status.success(),
        "`iris-gateway config` failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let shipped = std::fs::read(SHIPPED_CONFIG).expect("read systemd/config.toml");
    assert!(
        out.stdout == shipped,
        "`iris-gateway config` must print systemd/config.toml byte for byte; it printed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn config_template_loads_as_the_defaults() {
    let template = read(SHIPPED_CONFIG);
    let defaults = format!("{:#?}", Config::default());

    let loaded: Config = toml::from_str(&template)
        .unwrap_or_else(|e| panic!("the config template does not load: {e}"));
    assert_eq!(format!("{loaded:#?}"), defaults);
    loaded
        .validate()
        .expect("the template's settings are valid");

    // Every value the template shows as the default really is the default...
    let shown = uncommented(&template, false);
    let loaded: Config = toml::from_str(&shown).unwrap_or_else(|e| {
        panic!("the template with its defaults uncommented does not load: {e}\n{shown}")
    });
    assert_eq!(
        format!("{loaded:#?}"),
        defaults,
        "a value shown in the template is not the default"
    );

    // ...and the examples of settings without a default are well-formed.
    let all = uncommented(&template, true);
    let loaded: Config = toml::from_str(&all).unwrap_or_else(|e| {
        panic!("the template with every line uncommented does not load: {e}\n{all}")
    });
    loaded
        .validate()
        .expect("the template's examples are valid");
}

#[test]
fn config_template_names_every_setting() {
    let template = read(SHIPPED_CONFIG);
    let wanted = config_keys(&Config::default());
    // The parse of Debug output must itself work: spot-check a key of each kind.
    for key in [
        "listen",
        "data_dir",
        "demo.pace_ms",
        "limits.max_frame_bytes",
        "push.ntfy_token_file",
    ] {
        assert!(wanted.contains(key), "{key} missing from {wanted:?}");
    }
    let shown = template_keys(&template);
    // A section its own engineer adds to the template is exempt only until it appears there;
    // from then on every one of its keys is checked like the rest.
    let wanted: BTreeSet<String> = wanted
        .into_iter()
        .filter(|key| {
            !PENDING_SECTIONS.iter().any(|section| {
                key.starts_with(&format!("{section}."))
                    && !template.lines().any(|l| l == format!("[{section}]"))
            })
        })
        .collect();
    let missing: Vec<_> = wanted.difference(&shown).collect();
    let unknown: Vec<_> = shown.difference(&wanted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "systemd/config.toml must show every setting of Config; missing: {missing:?}, not settings: {unknown:?}"
    );

    // Each setting is explained by the comment right above it.
    let lines: Vec<&str> = template.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if key_line(line).is_some() {
            let above = if i > 0 { lines[i - 1] } else { "" };
            assert!(
                above.starts_with("# ") && key_line(above).is_none(),
                "`{line}` has no explaining comment above it"
            );
        }
    }
}

#[test]
fn unit_starts_with_the_file_the_package_ships() {
    // The package installs systemd/config.toml at the path the unit's ExecStart names.
    let unit = read(UNIT);
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .expect("ExecStart line");
    let path = exec
        .split_once("--config ")
        .map(|(_, p)| p.split_whitespace().next().unwrap_or(""))
        .expect("--config in ExecStart");
    assert_eq!(path, "/etc/iris-gateway/config.toml");
    assert!(Path::new(SHIPPED_CONFIG).is_file());
}
