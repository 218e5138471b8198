//! The command line as clap reads it: every command and its flags. The commands themselves
//! are the other files of this folder.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "iris-gateway",
    version,
    about = "Connects the Iris chat app to your Hermes agent"
)]
// The whole command line; plain comments on these types, since doc comments become help text.
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `run` is the default command, so its flags work without naming it
    /// (`iris-gateway --listen 127.0.0.1:9000`).
    #[command(flatten)]
    pub run: RunArgs,
}

// One variant per command; its doc comment is the command's help.
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
    Chat(ChatArgs),
    /// Write a backup of the store and media to FILE (while the gateway runs, or not).
    Backup(BackupArgs),
    /// Replace the store and media with a backup (the gateway must be stopped; the current
    /// store is moved aside, not deleted).
    Restore(RestoreArgs),
    /// Print the commented default config file to stdout, or (`--effective`) each setting in
    /// effect with where it comes from.
    ///
    /// Every setting appears, commented out at its default value, with what it does, e.g.
    /// `iris-gateway config > /etc/iris-gateway/config.toml`.
    Config(Box<ConfigArgs>),
    /// Set or remove the admin page's owner passphrase, at the box (a lost passphrase, or a
    /// claim that was not yours).
    Owner(OwnerArgs),
    /// Signed updates: install a staged one (the root helper's `apply` and `recover`), make a
    /// signing key, or sign a bundle.
    Update(UpdateArgs),
}

// `update apply|recover|keygen|bundle|verify`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    #[command(subcommand)]
    pub action: UpdateAction,
}

// The helper reads only the config file under /etc (root's), never the admin page's settings.
#[derive(Args, Debug)]
pub struct HelperArgs {
    /// The gateway's config file; its `[update]` section says where things are.
    #[arg(long, default_value = "/etc/iris-gateway/config.toml")]
    pub config: PathBuf,
    /// The gateway's data dir (default: the config's `data_dir`, else /var/lib/iris-gateway).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum UpdateAction {
    /// Install the update the gateway staged (run as root by iris-gateway-update.service).
    Apply(HelperArgs),
    /// Finish or undo an update a power cut interrupted (run as root at boot, before the
    /// gateway, by iris-gateway-update-recover.service).
    Recover {
        #[command(flatten)]
        helper: HelperArgs,
        /// Also stop and start the gateway (not at boot, where systemd starts it after this).
        #[arg(long)]
        restart: bool,
    },
    /// Make a signing key: the secret key to FILE (mode 0600), the public key to FILE.pub.
    Keygen {
        file: PathBuf,
        #[arg(long, default_value = "")]
        comment: String,
    },
    /// Sign BINARY as an update bundle.
    Bundle {
        #[arg(long)]
        binary: PathBuf,
        /// The version BINARY is (semver).
        #[arg(long)]
        version: String,
        /// aarch64, arm or x86_64.
        #[arg(long)]
        arch: String,
        /// The secret key file (`update keygen`).
        #[arg(long)]
        key: PathBuf,
        #[arg(long, default_value = "")]
        notes: String,
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Check a bundle's signature and contents against the trusted keys, changing nothing.
    Verify {
        bundle: PathBuf,
        /// Public keys trusted beside the built-in release key.
        #[arg(long, default_value = "/etc/iris-gateway/update-keys")]
        keys_dir: PathBuf,
    },
}

// `config`: the template, or with `--effective` what a `run` with these flags would use.
#[derive(Args, Debug)]
pub struct ConfigArgs {
    /// Show the settings in effect (flags > saved from the admin page > config file >
    /// defaults) and where each comes from, for the same flags `run` takes.
    #[arg(long)]
    pub effective: bool,
    /// Check that FILE is a config file the gateway takes (unknown keys, values out of range),
    /// changing nothing.
    #[arg(long, value_name = "FILE", conflicts_with = "effective")]
    pub check: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

// `owner set|reset`, on the data dir the gateway uses.
#[derive(Args, Debug)]
pub struct OwnerArgs {
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub action: OwnerAction,
}

// What `owner` does to the passphrase.
#[derive(Subcommand, Debug)]
pub enum OwnerAction {
    /// Set the owner passphrase (read from standard input; at a terminal, asked twice without
    /// echo). Every signed-in browser is signed out.
    Set,
    /// Remove the owner: the admin page shows set-up again, and every browser is signed out.
    Reset,
}

// Every flag that overrides a config key (see resolve.rs for the order).
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

// `pair`: who the new device is, and how to print its credentials.
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

// `devices`: list, or revoke with the subcommand.
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

// What `devices` does besides listing.
#[derive(Subcommand, Debug)]
pub enum DevicesAction {
    /// Revoke a device: its token stops working and its open connection is closed.
    Revoke { device_id: String },
}

// `status`: text for a person, JSON for a monitor.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

// `chat`: where to connect (a URL and token, or a local data dir to pair through).
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Gateway WebSocket URL (with --token); otherwise pair through --data-dir.
    #[arg(long, requires = "token")]
    pub url: Option<String>,
    #[arg(long, requires = "url")]
    pub token: Option<String>,
    /// For a wss:// URL: the SHA-256 fingerprint of the gateway's TLS certificate, as
    /// `iris-gateway pair` prints it (the connection fails unless the certificate matches).
    #[arg(long, requires = "url")]
    pub fingerprint: Option<String>,
    /// The data dir of a gateway on this machine (default: the gateway's default).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Channel to talk in, by name or chat id (created if no channel has that name).
    #[arg(long)]
    pub channel: Option<String>,
    /// Where files the agent sends are saved (created when needed; an existing file is never
    /// replaced). Default: $XDG_DOWNLOAD_DIR/iris, else ~/Downloads/iris.
    #[arg(long, value_name = "DIR")]
    pub downloads: Option<PathBuf>,
}

// `backup FILE`.
#[derive(Args, Debug)]
pub struct BackupArgs {
    /// Where to write the backup (replaced atomically if it exists).
    pub file: PathBuf,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

// `restore FILE`.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// A file written by `iris-gateway backup`, or a scheduled backup (encrypted: it also
    /// brings back the saved settings and the owner).
    pub file: PathBuf,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// For a scheduled backup: a file whose first line is its backup passphrase (else it is
    /// asked for, or read from stdin).
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
}
