//! Command-line interface: argument parsing and the `pair` / `devices` commands.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{default_data_dir, Config, ConfigError};
use crate::control::{self, ControlRequest, ControlResponse, Reached};
use crate::hub::new_device;
use crate::store::{Device, DeviceOrigin, Store};

#[derive(Parser, Debug)]
#[command(
    name = "iris-gateway",
    version,
    about = "Connects the Iris chat app to your Hermes agent"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `run` is the default command, so its flags work without naming it
    /// (`iris-gateway --listen 127.0.0.1:9000`).
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the gateway (the default when no command is given).
    Run(Box<RunArgs>),
    /// Mint a pairing token for one new device and print what the app needs.
    Pair(PairArgs),
    /// List paired devices, or revoke one.
    Devices(DevicesArgs),
    /// Health, agent, push, storage and devices of the running gateway (exit status 3 when no
    /// gateway runs on the data dir).
    Status(StatusArgs),
    /// A terminal client: chat with the agent through the gateway.
    Chat(crate::chat::ChatArgs),
    /// Write a backup of the store and media to FILE (while the gateway runs, or not).
    Backup(crate::backup::BackupArgs),
    /// Replace the store and media with a backup (the gateway must be stopped; the current
    /// store is moved aside, not deleted).
    Restore(crate::backup::RestoreArgs),
    /// Print the commented default config file to stdout, or (`--effective`) each setting in
    /// effect with where it comes from.
    ///
    /// Every setting appears, commented out at its default value, with what it does, e.g.
    /// `iris-gateway config > /etc/iris-gateway/config.toml`.
    Config(Box<ConfigArgs>),
    /// Set or remove the admin page's owner passphrase, at the box (a lost passphrase, or a
    /// claim that was not yours).
    Owner(OwnerArgs),
}

#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Show the settings in effect (flags > saved from the admin page > config file >
    /// defaults) and where each comes from, for the same flags `run` takes.
    #[arg(long)]
    pub effective: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct OwnerArgs {
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub action: OwnerAction,
}

#[derive(Subcommand, Debug)]
pub enum OwnerAction {
    /// Set the owner passphrase (read from standard input; at a terminal, asked twice without
    /// echo). Every signed-in browser is signed out.
    Set,
    /// Remove the owner: the admin page shows set-up again, and every browser is signed out.
    Reset,
}

#[derive(Args, Debug, Default)]
pub struct RunArgs {
    /// TOML config file (see docs/configuration.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address to listen on, e.g. 0.0.0.0:8765.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Agent backend: the built-in demo, a Hermes Agent, or any OpenAI-compatible server.
    #[arg(long, value_parser = ["demo", "hermes", "openai"])]
    pub agent: Option<String>,
    /// The agent's base URL (Hermes: http://HOST:8642; openai: http://HOST:PORT/v1).
    #[arg(long)]
    pub agent_url: Option<String>,
    /// The agent's API key (prefer --agent-key-file: command lines are visible to other users).
    #[arg(long)]
    pub agent_key: Option<String>,
    /// A file whose first line is the agent's API key.
    #[arg(long)]
    pub agent_key_file: Option<PathBuf>,
    /// Model to ask the agent for.
    #[arg(long)]
    pub agent_model: Option<String>,
    /// Milliseconds between the demo agent's streamed steps (0 = as fast as possible).
    #[arg(long)]
    pub demo_pace_ms: Option<u64>,
    /// Override limits.max_frame_bytes.
    #[arg(long)]
    pub max_frame_bytes: Option<usize>,
    /// Override limits.max_out_frame_bytes.
    #[arg(long)]
    pub max_out_frame_bytes: Option<usize>,
    /// Override limits.max_text_bytes.
    #[arg(long)]
    pub max_text_bytes: Option<usize>,
    /// Override store.outbox_retain_frames.
    #[arg(long)]
    pub outbox_retain_frames: Option<u64>,
    #[arg(long)]
    pub log_level: Option<String>,
    /// Push backend for devices that are away.
    #[arg(long, value_parser = ["none", "ntfy", "fcm"])]
    pub push: Option<String>,
    /// ntfy server URL (default https://ntfy.sh).
    #[arg(long)]
    pub ntfy_server: Option<String>,
    /// ntfy access token (prefer --ntfy-token-file: command lines are visible to other users).
    #[arg(long)]
    pub ntfy_token: Option<String>,
    #[arg(long)]
    pub ntfy_token_file: Option<PathBuf>,
    /// FCM service-account key file.
    #[arg(long)]
    pub fcm_credentials: Option<PathBuf>,
    /// Do not advertise the gateway on the LAN (mDNS); sets discovery.enabled = false.
    #[arg(long)]
    pub no_discovery: bool,
}

impl RunArgs {
    /// Defaults, then the file, then the settings saved from the admin page (in the data dir),
    /// then flags.
    pub fn resolve(&self) -> Result<(Config, PathBuf), ConfigError> {
        self.resolve_pinned().map(|(config, dir, _)| (config, dir))
    }

    /// As [`RunArgs::resolve`], with the keys the flags set.
    pub fn resolve_pinned(&self) -> Result<(Config, PathBuf, crate::config::Pinned), ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        let dir = self
            .data_dir
            .clone()
            .or_else(|| config.data_dir.clone())
            .unwrap_or_else(default_data_dir);
        crate::settings::Settings::load(&dir)?.apply(&mut config);
        let mut pinned = crate::config::Pinned::default();
        let flags: [(&'static str, bool); 10] = [
            ("data_dir", self.data_dir.is_some()),
            ("listen", self.listen.is_some()),
            ("agent.backend", self.agent.is_some()),
            ("agent.url", self.agent_url.is_some()),
            (
                "agent.key",
                self.agent_key.is_some() || self.agent_key_file.is_some(),
            ),
            ("agent.model", self.agent_model.is_some()),
            ("log_level", self.log_level.is_some()),
            ("push.backend", self.push.is_some()),
            ("push.ntfy_server", self.ntfy_server.is_some()),
            (
                "push.ntfy_token",
                self.ntfy_token.is_some() || self.ntfy_token_file.is_some(),
            ),
        ];
        for (key, set) in flags {
            if set {
                pinned.push(key);
            }
        }
        if let Some(v) = &self.data_dir {
            config.data_dir = Some(v.clone());
        }
        if let Some(v) = self.listen {
            config.listen = v;
        }
        if let Some(v) = &self.agent {
            config.agent.backend = v.clone();
        }
        if let Some(v) = &self.agent_url {
            config.agent.url = v.clone();
        }
        if let Some(v) = &self.agent_key {
            config.agent.key = crate::config::Secret(v.clone());
            config.agent.key_file = None;
        }
        if let Some(v) = &self.agent_key_file {
            config.agent.key_file = Some(v.clone());
        }
        if let Some(v) = &self.agent_model {
            config.agent.model = v.clone();
        }
        if let Some(v) = self.demo_pace_ms {
            config.demo.pace_ms = v;
        }
        if let Some(v) = self.max_frame_bytes {
            config.limits.max_frame_bytes = v;
        }
        if let Some(v) = self.max_out_frame_bytes {
            config.limits.max_out_frame_bytes = v;
        }
        if let Some(v) = self.max_text_bytes {
            config.limits.max_text_bytes = v;
        }
        if let Some(v) = self.outbox_retain_frames {
            config.store.outbox_retain_frames = v;
        }
        if let Some(v) = &self.log_level {
            config.log_level = v.clone();
        }
        if let Some(v) = &self.push {
            config.push.backend = v.clone();
        }
        if let Some(v) = &self.ntfy_server {
            config.push.ntfy_server = v.clone();
        }
        if let Some(v) = &self.ntfy_token {
            config.push.ntfy_token = Some(v.clone());
        }
        if let Some(v) = &self.ntfy_token_file {
            config.push.ntfy_token_file = Some(v.clone());
        }
        if let Some(v) = &self.fcm_credentials {
            config.push.fcm_credentials = Some(v.clone());
        }
        if self.no_discovery {
            config.discovery.enabled = false;
        }
        config.validate()?;
        let dir = config.data_dir.clone().unwrap_or_else(default_data_dir);
        Ok((config, dir, pinned))
    }
}

#[derive(Args, Debug)]
pub struct PairArgs {
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A name to recognise the device by in `iris-gateway devices`.
    #[arg(long, default_value = "")]
    pub name: String,
    /// The address the gateway listens on, for the URL (when the gateway is not running).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Print one line of JSON: {"token", "url", "device_id", "tls_url", "tls_fingerprint"},
    /// and no QR code.
    #[arg(long)]
    pub json: bool,
    /// Do not draw the QR code in the terminal.
    #[arg(long)]
    pub no_qr: bool,
    /// Mint no token here: get a fresh one-time code for the gateway's pairing page
    /// (http(s)://HOST:PORT/pair), to pair from a browser. Needs the gateway running.
    #[arg(long, conflicts_with_all = ["name", "listen", "no_qr"])]
    pub page: bool,
}

#[derive(Args, Debug)]
pub struct DevicesArgs {
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<DevicesAction>,
}

#[derive(Subcommand, Debug)]
pub enum DevicesAction {
    /// Revoke a device: its token stops working and its open connection is closed.
    Revoke { device_id: String },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot talk to the running gateway: {0}")]
    Control(#[from] std::io::Error),
    #[error("the gateway refused: {0}")]
    Refused(String),
    #[error("no device `{0}`")]
    NoSuchDevice(String),
    #[error("the pairing page is served by the running gateway, and none runs from this data dir (start it, or pair here without --page)")]
    PageNeedsGateway,
}

/// Credentials for one device, as printed by `pair`.
pub struct Paired {
    pub device_id: String,
    pub token: String,
    pub url: String,
    /// The `wss://` URL and the certificate fingerprint to pin, when TLS is on.
    pub tls: Option<crate::tls::Advert>,
}

/// Mints a device through the running gateway, or directly in the store when none runs.
pub fn pair(data_dir: &Path, name: &str, listen: Option<SocketAddr>) -> Result<Paired, CliError> {
    let req = ControlRequest::Pair {
        name: name.to_owned(),
    };
    match control::request(data_dir, &req)? {
        Reached::Answer(ControlResponse::Paired {
            device_id,
            token,
            url,
            tls,
        }) => Ok(Paired {
            device_id,
            token,
            url,
            tls,
        }),
        Reached::Answer(ControlResponse::Error { message }) => Err(CliError::Refused(message)),
        Reached::Answer(other) => Err(CliError::Refused(format!("unexpected answer {other:?}"))),
        Reached::NotRunning => {
            let store = open_offline(data_dir)?;
            let (device, token) = new_device(name, DeviceOrigin::Pair);
            store.add_device(&device)?;
            store.sync_blocking()?;
            let listen = listen.unwrap_or(Config::default().listen);
            // What the gateway served when it last ran (nothing if it never ran).
            let tls = crate::tls::last_served(data_dir, listen);
            let url = match &tls {
                Some(t) if !t.allow_plain => t.url.clone(),
                _ => crate::lan::pairing_url(listen),
            };
            Ok(Paired {
                device_id: device.device_id,
                token,
                url,
                tls,
            })
        }
    }
}

/// `pair --page`: a fresh one-time code for the running gateway's pairing page.
fn run_pair_page(data_dir: &Path, json: bool) -> Result<(), CliError> {
    let (code, page_url, expires_in_secs) =
        match control::request(data_dir, &ControlRequest::PairPage)? {
            Reached::Answer(ControlResponse::PageCode {
                code,
                page_url,
                expires_in_secs,
            }) => (code, page_url, expires_in_secs),
            Reached::Answer(ControlResponse::Error { message }) => {
                return Err(CliError::Refused(message))
            }
            Reached::Answer(other) => {
                return Err(CliError::Refused(format!("unexpected answer {other:?}")))
            }
            Reached::NotRunning => return Err(CliError::PageNeedsGateway),
        };
    if json {
        let out = serde_json::json!({
            "code": code, "page_url": page_url, "expires_in_secs": expires_in_secs,
        });
        println!("{out}");
    } else {
        println!("Open {page_url} in a browser and enter the code");
        println!("  {code}");
        println!(
            "It works once, for {} minutes; the page then shows the QR code to scan.",
            crate::pairing::page::ttl_minutes(Duration::from_secs(expires_in_secs))
        );
    }
    Ok(())
}

fn open_offline(data_dir: &Path) -> Result<Store, CliError> {
    Ok(Store::open(data_dir, 1 << 20, Duration::from_secs(5))?)
}

pub fn run_pair(args: PairArgs) -> Result<(), CliError> {
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    if args.page {
        return run_pair_page(&dir, args.json);
    }
    let paired = pair(&dir, &args.name, args.listen)?;
    let invitation =
        crate::pairing::Invitation::new(&paired.url, &paired.token, paired.tls.as_ref());
    if args.json {
        let mut out = serde_json::json!({ "token": paired.token, "url": paired.url, "device_id": paired.device_id });
        if let Some(t) = &paired.tls {
            out["tls_url"] = t.url.clone().into();
            out["tls_fingerprint"] = t.fingerprint.clone().into();
        }
        println!("{out}");
    } else {
        // The code first, so the text the app could also take stays in view below it.
        if !args.no_qr {
            println!("{}", invitation.terminal_qr());
        }
        println!("Paired device {}.", paired.device_id);
        if args.no_qr {
            println!("In the Iris app, add a gateway with:");
        } else {
            println!("In the Iris app, scan the code above, or add a gateway with:");
        }
        println!("  URL:   {}", paired.url);
        println!("  Token: {}", paired.token);
        if let Some(t) = &paired.tls {
            println!("  TLS:   {} with certificate SHA-256", t.url);
            println!("         {}", t.fingerprint);
        }
        println!(
            "The token is shown only now; revoke it with: iris-gateway devices revoke {}",
            paired.device_id
        );
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `status` found: the gateway answered, or nothing runs on the data dir.
pub enum StatusOutcome {
    Running,
    NotRunning,
}

/// Asks the running gateway for its health over the control socket. A gateway that is not
/// running is said so plainly (with where the store is and how many devices it has), not
/// treated as an error of the command: `StatusOutcome::NotRunning` lets the caller exit 3, as
/// LSB status commands do.
pub fn run_status(args: StatusArgs) -> Result<StatusOutcome, CliError> {
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    match control::request(&dir, &ControlRequest::Status)? {
        Reached::Answer(ControlResponse::Status { report }) => {
            if args.json {
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else {
                println!("{}", report.to_text());
            }
            Ok(StatusOutcome::Running)
        }
        Reached::Answer(ControlResponse::Error { message }) => Err(CliError::Refused(message)),
        Reached::Answer(other) => Err(CliError::Refused(format!("unexpected answer {other:?}"))),
        Reached::NotRunning => {
            // The store can be read while nothing holds it; a damaged or locked one is only
            // mentioned, the command is about the gateway.
            let devices = open_offline(&dir).and_then(|s| Ok(s.devices()?.len()));
            if args.json {
                let mut out = serde_json::json!({ "running": false, "data_dir": dir });
                if let Ok(n) = &devices {
                    out["devices_paired"] = (*n).into();
                }
                println!("{out}");
            } else {
                println!(
                    "Gateway: not running (nothing answers on {})",
                    control::socket_path(&dir).display()
                );
                match devices {
                    Ok(n) => println!("Devices: {n} paired (store in {})", dir.display()),
                    Err(e) => println!("Store:   {e}"),
                }
                println!("Start it with: sudo systemctl start iris-gateway (or iris-gateway run)");
            }
            Ok(StatusOutcome::NotRunning)
        }
    }
}

pub fn run_devices(args: DevicesArgs) -> Result<(), CliError> {
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    match args.action {
        None => {
            let devices = match control::request(&dir, &ControlRequest::Devices)? {
                Reached::Answer(ControlResponse::Devices { devices }) => devices,
                Reached::Answer(ControlResponse::Error { message }) => {
                    return Err(CliError::Refused(message))
                }
                Reached::Answer(other) => {
                    return Err(CliError::Refused(format!("unexpected answer {other:?}")))
                }
                Reached::NotRunning => open_offline(&dir)?.devices()?,
            };
            print_devices(&devices, args.json);
            Ok(())
        }
        Some(DevicesAction::Revoke { device_id }) => {
            let existed = match control::request(
                &dir,
                &ControlRequest::Revoke {
                    device_id: device_id.clone(),
                },
            )? {
                Reached::Answer(ControlResponse::Revoked { existed }) => existed,
                Reached::Answer(ControlResponse::Error { message }) => {
                    return Err(CliError::Refused(message))
                }
                Reached::Answer(other) => {
                    return Err(CliError::Refused(format!("unexpected answer {other:?}")))
                }
                Reached::NotRunning => {
                    let store = open_offline(&dir)?;
                    let existed = store.remove_device(&device_id)?;
                    store.sync_blocking()?;
                    existed
                }
            };
            if !existed {
                return Err(CliError::NoSuchDevice(device_id));
            }
            if args.json {
                println!("{}", serde_json::json!({ "revoked": device_id }));
            } else {
                println!("Revoked {device_id}.");
            }
            Ok(())
        }
    }
}

fn print_devices(devices: &[Device], json: bool) {
    if json {
        let list: Vec<_> = devices
            .iter()
            .map(|d| {
                serde_json::json!({
                    "device_id": d.device_id, "name": d.name, "origin": d.origin,
                    "created_ms": d.created_ms, "last_seen_ms": d.last_seen_ms,
                    "app_device_id": d.app_device_id,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
        return;
    }
    if devices.is_empty() {
        println!("No devices are paired. Pair one with: iris-gateway pair --name NAME");
        return;
    }
    println!("{:<32} {:<24} {:<8} LAST SEEN", "DEVICE", "NAME", "ORIGIN");
    for d in devices {
        let seen = match d.last_seen_ms {
            Some(ms) => format!("{}s ago", (crate::ids::now_ms() - ms).max(0) / 1000),
            None => "never".into(),
        };
        let origin = match d.origin {
            DeviceOrigin::Pair => "pair",
            DeviceOrigin::Startup => "startup",
        };
        println!("{:<32} {:<24} {:<8} {}", d.device_id, d.name, origin, seen);
    }
}

/// `config --effective`: each setting in effect and where it came from.
pub fn run_config_effective(args: &RunArgs) -> Result<(), CliError> {
    let (config, dir, pinned) = args
        .resolve_pinned()
        .map_err(|e| CliError::Refused(e.to_string()))?;
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)?;
            Some(
                toml::from_str::<toml::Table>(&text)
                    .map_err(|e| CliError::Refused(format!("{}: {e}", path.display())))?,
            )
        }
        None => None,
    };
    let saved =
        crate::settings::Settings::load(&dir).map_err(|e| CliError::Refused(e.to_string()))?;
    println!("# Order: command-line flags > saved from the admin page > config file > defaults");
    match &args.config {
        Some(p) => println!("# config file: {}", p.display()),
        None => println!("# config file: none (--config not given)"),
    }
    println!(
        "# saved settings: {}",
        crate::settings::path(&dir).display()
    );
    for row in crate::settings::explain(&config, &pinned, file.as_ref(), &saved) {
        println!("{} = {}    ({})", row.key, row.value, row.source.label());
    }
    Ok(())
}

/// `owner set` / `owner reset`.
pub fn run_owner(args: OwnerArgs) -> Result<(), CliError> {
    use crate::admin::owner;
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    let fail = |e: owner::OwnerError| CliError::Refused(e.to_string());
    match args.action {
        OwnerAction::Set => {
            let passphrase = read_passphrase()?;
            let new = owner::hash(&passphrase).map_err(fail)?;
            owner::store(&dir, &new).map_err(fail)?;
            println!("Owner passphrase set; any browser signed in must sign in again.");
        }
        OwnerAction::Reset => {
            if owner::reset(&dir).map_err(fail)? {
                println!("Owner removed: the admin page shows set-up again (the first to open it claims the box).");
            } else {
                println!("There was no owner: the admin page already shows set-up.");
            }
        }
    }
    Ok(())
}

/// The new passphrase: asked twice without echo at a terminal, else the first line of stdin.
fn read_passphrase() -> Result<zeroize::Zeroizing<String>, CliError> {
    use std::io::{BufRead, IsTerminal, Write};
    let stdin = std::io::stdin();
    let read_line = || -> Result<zeroize::Zeroizing<String>, CliError> {
        let mut line = zeroize::Zeroizing::new(String::new());
        stdin.lock().read_line(&mut line)?;
        let trimmed = zeroize::Zeroizing::new(line.trim_end_matches(['\r', '\n']).to_owned());
        Ok(trimmed)
    };
    if !stdin.is_terminal() {
        return read_line();
    }
    let _echo_off = EchoOff::new();
    eprint!(
        "New owner passphrase (at least {} characters): ",
        crate::admin::owner::MIN_PASSPHRASE_CHARS
    );
    let _ = std::io::stderr().flush();
    let first = read_line()?;
    eprint!("\nThe same again: ");
    let _ = std::io::stderr().flush();
    let second = read_line()?;
    eprintln!();
    if *first != *second {
        return Err(CliError::Refused("the two passphrases differ".into()));
    }
    Ok(first)
}

/// Turns terminal echo off on stdin while alive.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a zeroed termios the call fills in.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return EchoOff(None);
            }
            let saved = t;
            t.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            EchoOff(Some(saved))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, t);
            }
        }
    }
}
