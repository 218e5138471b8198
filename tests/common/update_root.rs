//! A scratch root for the update tests (tests/update.rs, tests/update_kill.rs): a temp dir `R`
//! laid out as the box is, so the real helper (`iris-gateway update apply|recover`) works on it
//! and nothing touches the machine's own system:
//!
//! ```text
//! R/usr/bin/iris-gateway                  the installed binary (a stripped copy of this build)
//! R/var/lib/iris-gateway/                 the gateway's data dir
//! R/var/lib/iris-gateway-update/          the helper's directory (it exists: "helper installed")
//! R/etc/iris-gateway/config.toml          listen, data_dir, the demo agent, [update]
//! R/etc/iris-gateway/update-keys/test.pub the key the test signs with (made at test time)
//! R/sbin/start-gateway, R/sbin/stop-gateway  the `[update] start` and `stop` commands
//! ```
//!
//! The start and stop scripts play systemd: start runs `R/usr/bin/iris-gateway run` in the
//! background (pid file, log file), stop sends SIGTERM and waits, bounded, until it is gone.
//!
//! **Versions.** The tests have one build, but an update needs an old and a new version. A debug
//! build says it is the version in `IRIS_GATEWAY_VERSION` (src/update/version.rs), so each
//! "version" here is the stripped binary with a few bytes appended (an ELF with trailing bytes
//! runs the same), and a map file `R/versions` says which SHA-256 is which version. The start
//! script, and every helper run here, sets `IRIS_GATEWAY_VERSION` from the hash of the binary it
//! is about to run: that is the stand-in for binaries built as different versions. A binary the
//! map does not name (`/bin/false` as a failing update) runs without it.
//!
//! Every process a root starts is killed (and reaped) when the root is dropped, also when a test
//! fails half-way.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use iris_gateway::control::{ControlRequest, ControlResponse, Reached};
use iris_gateway::update::policy::Consent;
use iris_gateway::update::stage::Updates;
use iris_gateway::update::Entry;
use serde_json::{json, Value};

use super::{frame_type, run_bounded, Client, Paired, BIN};

/// Longest a helper run may take here (a failing update waits the whole health window).
const HELPER_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest the gateway may take to answer after a start.
const SERVE_TIMEOUT: Duration = Duration::from_secs(30);

/// The versions a test plays, worked out from the crate's own version (what the test process
/// and an unmarked build say they are), so a version bump in Cargo.toml keeps the steps right.
#[derive(Debug, Clone)]
pub struct Versions {
    /// The running version: the crate's.
    pub old: String,
    /// A newer version with the same major part: installed without asking.
    pub minor: String,
    /// A newer version with another major part (for 0.y, another y): needs consent.
    pub major: String,
    /// An older version: needs consent.
    pub older: String,
}

pub fn versions() -> Versions {
    use iris_gateway::update::version::{step, Step};
    let old = semver::Version::parse(env!("CARGO_PKG_VERSION")).expect("the crate's version");
    let v = |major, minor, patch| semver::Version::new(major, minor, patch);
    let minor = v(old.major, old.minor, old.patch + 1);
    let major = match (old.major, old.minor) {
        (0, 0) => v(0, 0, old.patch + 1),
        (0, m) => v(0, m + 1, 0),
        (x, _) => v(x + 1, 0, 0),
    };
    let older = if old.patch > 0 {
        v(old.major, old.minor, old.patch - 1)
    } else if old.minor > 0 {
        v(old.major, old.minor - 1, 9)
    } else {
        v(old.major - 1, 9, 9)
    };
    // A 0.0.z crate has no minor step: every newer version is a major one.
    let minor = if step(&old, &minor) == Step::Minor {
        minor
    } else {
        panic!("no minor step from {old}: these tests need a crate version of 0.1.0 or later")
    };
    assert_eq!(step(&old, &major), Step::Major);
    assert_eq!(step(&old, &older), Step::Older);
    Versions {
        old: old.to_string(),
        minor: minor.to_string(),
        major: major.to_string(),
        older: older.to_string(),
    }
}

/// Lower-case hex SHA-256 of a file (by `sha256sum`: the test build's own SHA-256 is
/// unoptimised, and the binaries here are 46 MB).
pub fn file_sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("sha256sum: {e}"));
    assert!(
        out.status.success(),
        "sha256sum {}: {out:?}",
        path.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let hash = text.split_whitespace().next().unwrap_or("").to_owned();
    assert_eq!(hash.len(), 64, "sha256sum said {text:?}");
    hash
}

/// The test process adopts what its children leave behind (the gateway the start script puts
/// in the background outlives the script), so it can reap them: PID 1 in a container may not.
fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// A process that is gone: no such process, or a zombie (dead, not yet reaped).
pub fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            // `pid (comm) S …`: the state follows the last `)`.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            matches!(state, "Z" | "X" | "")
        }
    }
}

/// SIGKILL, and wait until it is gone (a zombie: the test process, their subreaper, reaps its
/// roots' processes only when the root is dropped, so no pid here is reused meanwhile).
fn kill_pid(pid: i32) {
    // SAFETY: kill(2) on a pid; no memory is involved.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pid_gone(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid(2) with WNOHANG; ECHILD for a pid that is not our child is harmless.
    unsafe {
        libc::waitpid(pid, &mut status, libc::WNOHANG);
    }
}

/// Both streams of a finished command, for assertions and panic messages.
pub fn shown(out: &Output) -> String {
    format!(
        "exit: {:?} (signal {:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        out.status.signal(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One scratch root, its gateway stopped or running.
pub struct Root {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    /// `R/usr/bin/iris-gateway`: `[update] binary`, what the start script runs.
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    pub helper_dir: PathBuf,
    pub keys_dir: PathBuf,
    pub config: PathBuf,
    /// The secret half of `keys_dir/test.pub`.
    pub key: PathBuf,
    pub url: String,
    pub versions: Versions,
    /// The binary that was installed first (the old version).
    pub old_bin: PathBuf,
    version_map: PathBuf,
    pid_file: PathBuf,
    all_pids: PathBuf,
    log: PathBuf,
}

impl Root {
    /// A root with the old version installed (not running yet) and a new health window of
    /// `window_secs` (the time a failing update takes to be rolled back).
    pub fn new(window_secs: u64) -> Root {
        become_subreaper();
        let dir = tempfile::Builder::new()
            .prefix("iris-gw-update-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().to_owned();
        let mkdir = |rel: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
            p
        };
        let bin_dir = mkdir("usr/bin");
        let data_dir = mkdir("var/lib/iris-gateway");
        let helper_dir = mkdir("var/lib/iris-gateway-update");
        let etc = mkdir("etc/iris-gateway");
        let keys_dir = mkdir("etc/iris-gateway/update-keys");
        let sbin = mkdir("sbin");
        let build = mkdir("build");
        let signing = mkdir("signing");
        let versions = versions();

        // The debug binary is far over a bundle's 64 MiB: the stripped copy is what a box runs.
        let old_bin = build.join(format!("iris-gateway-{}", versions.old));
        let out = run_bounded(
            {
                let mut c = Command::new("strip");
                c.arg("-o").arg(&old_bin).arg(BIN);
                c
            },
            Duration::from_secs(60),
            "strip",
        );
        assert!(out.status.success(), "strip failed:\n{}", shown(&out));
        let bin = bin_dir.join("iris-gateway");
        std::fs::copy(&old_bin, &bin).expect("install the old binary");

        let key = signing.join("test");
        let out = super::cli_os(&[
            "update".as_ref(),
            "keygen".as_ref(),
            key.as_os_str(),
            "--comment".as_ref(),
            "update tests".as_ref(),
        ]);
        assert!(out.status.success(), "update keygen:\n{}", shown(&out));
        std::fs::copy(signing.join("test.pub"), keys_dir.join("test.pub")).expect("trust the key");

        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let r = Root {
            root: root.clone(),
            bin,
            data_dir,
            helper_dir,
            keys_dir,
            config: etc.join("config.toml"),
            key,
            url: format!("ws://127.0.0.1:{port}"),
            versions,
            old_bin,
            version_map: root.join("versions"),
            pid_file: root.join("gateway.pid"),
            all_pids: root.join("gateway.pids"),
            log: root.join("gateway.log"),
            _dir: dir,
        };
        std::fs::write(&r.version_map, "").unwrap();
        r.map_version(&r.old_bin, &r.versions.old.clone());

        let start = sbin.join("start-gateway");
        let stop = sbin.join("stop-gateway");
        r.write_script(&start, &r.start_script());
        r.write_script(&stop, &r.stop_script());
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\n\
             data_dir = {data:?}\n\
             \n[demo]\npace_ms = 0\n\
             \n[discovery]\nenabled = false\n\
             \n[update]\n\
             window_secs = {window_secs}\n\
             max_window_secs = 60\n\
             helper_dir = {helper:?}\n\
             binary = {bin:?}\n\
             keys_dir = {keys:?}\n\
             stop = [{stop:?}]\n\
             start = [{start:?}]\n",
            data = r.data_dir.to_str().unwrap(),
            helper = r.helper_dir.to_str().unwrap(),
            bin = r.bin.to_str().unwrap(),
            keys = r.keys_dir.to_str().unwrap(),
            stop = stop.to_str().unwrap(),
            start = start.to_str().unwrap(),
        );
        std::fs::write(&r.config, config).unwrap();
        // The helper refuses a config file anyone but root could change.
        std::fs::set_permissions(&r.config, std::fs::Permissions::from_mode(0o644)).unwrap();
        r
    }

    fn write_script(&self, path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn start_script(&self) -> String {
        format!(
            r#"#!/bin/sh
# Starts the scratch root's gateway in the background, as systemd would start the service.
# IRIS_GATEWAY_VERSION comes from the hash of the binary: the stand-in for binaries built as
# different versions (tests/common/update_root.rs).
bin='{bin}'
hash=$(sha256sum "$bin" | cut -d' ' -f1)
version=$(awk -v h="$hash" '$1 == h {{ print $2 }}' '{map}')
unset IRIS_GATEWAY_KILL_AT
if [ -n "$version" ]; then
    export IRIS_GATEWAY_VERSION="$version"
else
    unset IRIS_GATEWAY_VERSION
fi
echo "start: $hash ${{version:-unknown version}}" >> '{log}'
"$bin" run --config '{config}' < /dev/null >> '{log}' 2>&1 &
echo $! >> '{pids}'
echo $! > '{pid}.tmp' && mv '{pid}.tmp' '{pid}'
"#,
            bin = self.bin.display(),
            map = self.version_map.display(),
            log = self.log.display(),
            config = self.config.display(),
            pids = self.all_pids.display(),
            pid = self.pid_file.display(),
        )
    }

    fn stop_script(&self) -> String {
        format!(
            r#"#!/bin/sh
# Stops the scratch root's gateway: SIGTERM, then waits until it is gone (a zombie counts as
# gone); SIGKILL after 10 s, as systemd would.
pidfile='{pid}'
[ -f "$pidfile" ] || exit 0
pid=$(cat "$pidfile")
alive() {{
    [ -r "/proc/$pid/stat" ] || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
    [ "$state" != Z ] && [ "$state" != X ]
}}
alive && kill -TERM "$pid"
i=0
while alive; do
    i=$((i + 1))
    [ $i -eq 200 ] && kill -KILL "$pid"
    if [ $i -ge 400 ]; then
        echo "the gateway ($pid) did not stop" >&2
        exit 1
    fi
    sleep 0.05
done
echo "stop: $pid" >> '{log}'
rm -f "$pidfile"
"#,
            pid = self.pid_file.display(),
            log = self.log.display(),
        )
    }

    /// Records that the binary at `path` is `version` (see the module's note on versions).
    fn map_version(&self, path: &Path, version: &str) {
        use std::io::Write;
        // One line a hash: the start script reads every line that matches.
        if self.version_of(path).is_some() {
            return;
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.version_map)
            .unwrap();
        writeln!(f, "{} {version}", file_sha256(path)).unwrap();
    }

    /// The version the binary at `path` stands for, if the map names it.
    pub fn version_of(&self, path: &Path) -> Option<String> {
        let hash = file_sha256(path);
        std::fs::read_to_string(&self.version_map)
            .unwrap()
            .lines()
            .find_map(|l| {
                let (h, v) = l.split_once(' ')?;
                (h == hash).then(|| v.to_owned())
            })
    }

    /// A binary that stands for `version`: the stripped build with bytes appended, so its hash
    /// differs, and the map names it.
    pub fn variant(&self, version: &str) -> PathBuf {
        let path = self
            .root
            .join("build")
            .join(format!("iris-gateway-{version}"));
        let mut bytes = std::fs::read(&self.old_bin).unwrap();
        bytes.extend_from_slice(format!("\0iris-gateway test build {version}\0").as_bytes());
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        self.map_version(&path, version);
        path
    }

    /// Signs `binary` as `version` for `arch` with `key` (the trusted test key by default):
    /// `update bundle`, the signer's own command.
    pub fn bundle_with(
        &self,
        binary: &Path,
        version: &str,
        arch: &str,
        key: &Path,
        name: &str,
    ) -> PathBuf {
        let out_path = self.root.join("build").join(name);
        let out = super::cli_os(&[
            "update".as_ref(),
            "bundle".as_ref(),
            "--binary".as_ref(),
            binary.as_os_str(),
            "--version".as_ref(),
            version.as_ref(),
            "--arch".as_ref(),
            arch.as_ref(),
            "--key".as_ref(),
            key.as_os_str(),
            "--notes".as_ref(),
            "test build".as_ref(),
            "-o".as_ref(),
            out_path.as_os_str(),
        ]);
        assert!(out.status.success(), "update bundle:\n{}", shown(&out));
        out_path
    }

    /// A bundle of a `version` build for this box, well formed but signed by a key this box does
    /// not trust (made once, beside the trusted one).
    pub fn untrusted_bundle(&self, version: &str) -> PathBuf {
        let key = self.root.join("signing/untrusted");
        if !key.exists() {
            let out = super::cli_os(&[
                "update".as_ref(),
                "keygen".as_ref(),
                key.as_os_str(),
                "--comment".as_ref(),
                "not trusted".as_ref(),
            ]);
            assert!(out.status.success(), "update keygen:\n{}", shown(&out));
        }
        self.bundle_with(
            &self.variant(version),
            version,
            std::env::consts::ARCH,
            &key,
            "untrusted.iub",
        )
    }

    /// A bundle of `binary` as `version` for this box, signed with the trusted test key.
    pub fn bundle(&self, binary: &Path, version: &str) -> PathBuf {
        self.bundle_with(
            binary,
            version,
            std::env::consts::ARCH,
            &self.key,
            &format!("iris-gateway-{version}.iub"),
        )
    }

    /// The `[update]` section as the gateway reads it, from the root's config file.
    pub fn updates(&self) -> Updates {
        let config =
            iris_gateway::config::Config::from_file(&self.config).expect("the root's config");
        Updates::new(&config.update, &self.data_dir)
    }

    /// Stages `bundle` as the gateway does with an upload: copied to the upload file, then
    /// checked and staged (`Updates::stage`, in this process, which is the crate's version).
    pub fn stage(
        &self,
        bundle: &Path,
        consent: Consent,
    ) -> Result<iris_gateway::update::bundle::Verified, iris_gateway::update::Error> {
        let updates = self.updates();
        let upload = updates.upload_path().expect("the upload path");
        std::fs::copy(bundle, &upload).expect("receive the bundle");
        updates.stage(&upload, consent)
    }

    pub fn stage_dir(&self) -> PathBuf {
        self.data_dir.join("update")
    }

    /// Nothing is staged: neither the bundle nor the helper's trigger.
    pub fn nothing_staged(&self) -> bool {
        !self.stage_dir().join("staged.json").exists()
            && !self.stage_dir().join("staged.iub").exists()
    }

    pub fn store_backup(&self) -> PathBuf {
        self.stage_dir().join("store-backup")
    }

    pub fn journal_exists(&self) -> bool {
        self.helper_dir.join("journal.json").exists()
    }

    pub fn helper_file(&self, name: &str) -> PathBuf {
        self.helper_dir.join(name)
    }

    /// The update history, newest first.
    pub fn history(&self) -> Vec<Entry> {
        self.updates().state().history
    }

    pub fn last_entry(&self) -> Entry {
        self.history()
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("the update history is empty\n{}", self.log_tail()))
    }

    /// Runs the helper (`update apply|recover …`) from `binary`, as root runs it, with the
    /// version that binary stands for and `env` (a kill point); bounded in time.
    pub fn helper(&self, binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(binary);
        cmd.arg("update")
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("IRIS_GATEWAY_VERSION")
            .env_remove("IRIS_GATEWAY_KILL_AT")
            .envs(env.iter().copied());
        if let Some(v) = self.version_of(binary) {
            cmd.env("IRIS_GATEWAY_VERSION", v);
        }
        run_bounded(
            cmd,
            HELPER_TIMEOUT,
            &format!("iris-gateway update {}", args.join(" ")),
        )
    }

    /// `update apply` from the installed binary, as iris-gateway-update.service runs it.
    pub fn apply(&self, env: &[(&str, &str)]) -> Output {
        self.helper(&self.bin, &["apply"], env)
    }

    /// The boot after a power cut: `update recover` (no restart) from the previous binary when
    /// the helper left one, else the installed binary (the recover unit's rule), then the
    /// gateway's start.
    pub fn boot(&self) -> Output {
        let previous = self.helper_file("previous-binary");
        let from = if previous.exists() {
            previous
        } else {
            self.bin.clone()
        };
        let out = self.helper(&from, &["recover"], &[]);
        assert!(
            out.status.success(),
            "update recover at boot failed:\n{}\n{}",
            shown(&out),
            self.log_tail()
        );
        self.start();
        out
    }

    pub fn start(&self) {
        let out = run_bounded(
            Command::new(self.root.join("sbin/start-gateway")),
            Duration::from_secs(30),
            "the start script",
        );
        assert!(out.status.success(), "start script:\n{}", shown(&out));
    }

    pub fn stop(&self) {
        let out = run_bounded(
            Command::new(self.root.join("sbin/stop-gateway")),
            Duration::from_secs(60),
            "the stop script",
        );
        assert!(out.status.success(), "stop script:\n{}", shown(&out));
    }

    /// The pid the start script wrote last, if its process still runs.
    pub fn gateway_pid(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (!pid_gone(pid)).then_some(pid)
    }

    /// The power goes: the running gateway, if any, dies at once.
    pub fn power_cut(&self) {
        if let Some(pid) = self.gateway_pid() {
            kill_pid(pid);
        }
    }

    /// The gateway's status report over its control socket (what `status --json` prints), or
    /// `None` when nothing answers there.
    fn control_status(&self) -> Option<Value> {
        match iris_gateway::control::request(&self.data_dir, &ControlRequest::Status) {
            Ok(Reached::Answer(ControlResponse::Status { report })) => {
                Some(serde_json::to_value(report).expect("a report serializes"))
            }
            _ => None,
        }
    }

    /// `iris-gateway status --json`, or `None` when no gateway answers on the data dir (the
    /// command then looks at the store itself, which waits for a gateway that is starting: so
    /// the waits below ask the control socket, and this only once something answers).
    pub fn status(&self) -> Option<Value> {
        let out = super::cli_os(&[
            "status".as_ref(),
            "--json".as_ref(),
            "--data-dir".as_ref(),
            self.data_dir.as_os_str(),
        ]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits until a gateway answers and `pred` holds for its status; returns that status as
    /// `status --json` prints it.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + SERVE_TIMEOUT;
        let mut last = None;
        loop {
            if let Some(s) = self.control_status() {
                if pred(&s) {
                    if let Some(s) = self.status().filter(|s| pred(s)) {
                        return s;
                    }
                }
                last = Some(s);
            }
            assert!(
                Instant::now() < deadline,
                "no gateway status with {what} within {SERVE_TIMEOUT:?}; last: {last:?}\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the gateway answers at all; returns its status.
    pub fn wait_serving(&self) -> Value {
        self.wait_status("any answer", |_| true)
    }

    /// Starts the old version and waits until it serves.
    pub fn start_serving(&self) -> Value {
        self.start();
        let old = self.versions.old.clone();
        self.wait_status(&format!("version {old}"), |s| s["version"] == old.as_str())
    }

    /// The end of the gateways' shared log file, for panic messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(60);
        format!(
            "--- gateway log (tail) ---\n{}\n---",
            lines[from..].join("\n")
        )
    }

    /// Pairs a device (the `pair` command on the data dir).
    pub fn pair(&self, name: &str) -> Paired {
        super::pair(&self.data_dir, name)
    }

    /// Says hello as `device`: the `hello.ack` and the `status` after it. A refused upgrade
    /// (the port not open yet after a start, or 503 while a version is on trial) is tried again
    /// for a while, as an app does.
    pub async fn connect(&self, device: &Paired) -> (Client, Value) {
        let deadline = Instant::now() + SERVE_TIMEOUT;
        let mut c = loop {
            match Client::try_open(&self.url).await {
                Ok(c) => break c,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no WebSocket within {SERVE_TIMEOUT:?}: {e}\n{}",
                    self.log_tail()
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let ack = c.hello_on(&device.token, &device.device_id).await;
        let status = c.recv().await;
        assert_eq!(frame_type(&status), "status", "{status}");
        (c, ack)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // No panics here: Drop also runs while a failing test unwinds.
        let pids = std::fs::read_to_string(&self.all_pids).unwrap_or_default();
        for pid in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            kill_pid(pid);
            reap(pid);
        }
    }
}

/// A message the gateway acknowledged: its id and text.
#[derive(Debug, Clone)]
pub struct Acked {
    pub id: String,
    pub text: String,
}

/// Sends `text` into the default channel and waits for its `read.receipt` (the gateway's
/// acknowledgement: the message is in the store) and the demo agent's answer.
pub async fn send_acked(c: &mut Client, text: &str) -> Acked {
    let id = super::send_until_stop(c, Some("default"), None, text).await;
    Acked {
        id,
        text: text.to_owned(),
    }
}

/// The default channel's history (up to 200 messages).
pub async fn default_history(c: &mut Client) -> Vec<Value> {
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 200 }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "history", "{r}");
    r["payload"]["messages"].as_array().unwrap().clone()
}

/// Every acknowledged message is in the default channel's history, with its text.
pub async fn assert_all_in_history(c: &mut Client, acked: &[Acked]) {
    let history = default_history(c).await;
    for a in acked {
        assert!(
            history
                .iter()
                .any(|m| field(m, "message_id") == a.id && field(m, "text") == a.text),
            "acknowledged message {} ({:?}) is not in history:\n{}",
            a.id,
            a.text,
            super::dump(&history)
        );
    }
}

/// The phone connects to whichever version runs now: it finds every message acknowledged so
/// far, and one more it sends (`text`) is acknowledged and kept too.
pub async fn still_serves(r: &Root, phone: &Paired, acked: &mut Vec<Acked>, text: &str) {
    let (mut c, _) = r.connect(phone).await;
    assert_all_in_history(&mut c, acked).await;
    acked.push(send_acked(&mut c, text).await);
    assert_all_in_history(&mut c, acked).await;
    c.close().await;
}

fn field<'a>(m: &'a Value, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The status code and headers (names lower-cased) of the answer to a raw HTTP request on the
/// gateway's port; only the head is read, so a kept-alive connection does not matter.
pub async fn http_head(url: &str, request: &str) -> (u16, Vec<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("ws://");
    let read = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        std::io::Result::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("no answer from {addr} within 10 s"))
        .unwrap_or_else(|e| panic!("HTTP to {addr}: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

/// A WebSocket upgrade request, as an app sends it.
pub fn upgrade_request(url: &str) -> String {
    let host = url.trim_start_matches("ws://");
    format!(
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}
