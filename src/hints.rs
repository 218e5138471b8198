//! The commands the gateway prints for its owner to type (start-up lines, the admin and pairing
//! pages, error messages, the command line's own advice), built from the arguments the running
//! gateway (or command) was given. A hint that leaves out a non-default `--data-dir` sends the
//! typed command to another store, where it makes a new one and finds no gateway; so every
//! printed command goes through [`command`], which adds the flags this gateway needs.
//!
//! The invocation is recorded once, at start, by the binary ([`Invocation::install`]); until then
//! (unit tests, library users) commands are printed bare, for the defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::config::{default_data_dir, Config};

/// The program's name as the owner types it.
pub const PROGRAM: &str = "iris-gateway";

static INSTALLED: OnceLock<Invocation> = OnceLock::new();

/// What a printed command must repeat of this process's own arguments: only what differs from
/// the defaults, so a default install prints the short forms the README shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    data_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    listen: Option<SocketAddr>,
}

impl Invocation {
    /// `data_dir` as resolved (flag, config file or default); `config` the `--config` given;
    /// `listen` the address served, left out when it is the default or a port the system chose
    /// (port 0 cannot be typed back).
    pub fn new(data_dir: &Path, config: Option<&Path>, listen: Option<SocketAddr>) -> Invocation {
        let data_dir = absolute(data_dir);
        Invocation {
            data_dir: (data_dir != absolute(&default_data_dir())).then_some(data_dir),
            config: config.map(absolute),
            listen: listen.filter(|l| l.port() != 0 && *l != Config::default().listen),
        }
    }

    /// A command on `data_dir` named even when it is this process's default: for a command
    /// typed where the defaults differ (a shell, for a service whose default is systemd's
    /// `STATE_DIRECTORY`).
    pub fn on(data_dir: &Path) -> Invocation {
        Invocation {
            data_dir: Some(absolute(data_dir)),
            ..Invocation::default()
        }
    }

    /// Makes this the invocation every later [`command`] uses. The first call wins: a process
    /// runs with one set of arguments.
    pub fn install(self) {
        let _ = INSTALLED.set(self);
    }

    /// `iris-gateway COMMAND` with the flags its subcommand takes from this invocation
    /// (`--data-dir` for every command on a gateway's data; `--config` for `run` and `config`;
    /// `--listen` for `run`, `config` and `pair`, which prints the URL when no gateway answers).
    /// `COMMAND` is what follows the program's name, placeholders (`NAME`, `FILE`) included.
    pub fn command(&self, command: &str) -> String {
        let subcommand = command.split_whitespace().next().unwrap_or("");
        let takes_data_dir = !matches!(subcommand, "update" | "");
        let takes_config = matches!(subcommand, "run" | "config");
        let takes_listen = takes_config || (subcommand == "pair" && !command.contains("--page"));
        // Right after the subcommand, where every one of its flags is taken (the data dir of
        // `devices` and `owner` is global to their own subcommands).
        let mut line = format!("{PROGRAM} {subcommand}");
        if let Some(config) = self.config.as_ref().filter(|_| takes_config) {
            line.push_str(" --config ");
            line.push_str(&shell_word(config));
        }
        if let Some(dir) = self.data_dir.as_ref().filter(|_| takes_data_dir) {
            line.push_str(" --data-dir ");
            line.push_str(&shell_word(dir));
        }
        if let Some(listen) = self.listen.filter(|_| takes_listen) {
            line.push_str(&format!(" --listen {listen}"));
        }
        let rest = command[subcommand.len()..].trim_start();
        if !rest.is_empty() {
            line.push(' ');
            line.push_str(rest);
        }
        line
    }
}

/// [`Invocation::command`] for this process's installed invocation.
pub fn command(command: &str) -> String {
    match INSTALLED.get() {
        Some(invocation) => invocation.command(command),
        None => Invocation::default().command(command),
    }
}

/// A path as typed from any working directory.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// A path as one shell word: bare when it is plain, else in single quotes.
fn shell_word(path: &Path) -> String {
    let text = path.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%".contains(c));
    if plain {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_differs_from_the_defaults_is_repeated_and_only_where_it_applies() {
        let plain = Invocation::new(&default_data_dir(), None, Some(Config::default().listen));
        assert_eq!(plain.command("chat"), "iris-gateway chat");
        let custom = Invocation::new(
            Path::new("/srv/my iris"),
            Some(Path::new("/etc/iris.toml")),
            Some("127.0.0.1:9000".parse().unwrap()),
        );
        assert_eq!(
            custom.command("pair --name NAME"),
            "iris-gateway pair --data-dir '/srv/my iris' --listen 127.0.0.1:9000 --name NAME"
        );
        assert_eq!(
            custom.command("pair --page"),
            "iris-gateway pair --data-dir '/srv/my iris' --page"
        );
        assert_eq!(
            custom.command("run"),
            "iris-gateway run --config /etc/iris.toml --data-dir '/srv/my iris' --listen 127.0.0.1:9000"
        );
        let chosen_port = Invocation::new(
            Path::new("/srv/x"),
            None,
            Some("127.0.0.1:0".parse().unwrap()),
        );
        assert_eq!(
            chosen_port.command("pair"),
            "iris-gateway pair --data-dir /srv/x"
        );
        assert_eq!(
            chosen_port.command("devices revoke dev_1"),
            "iris-gateway devices --data-dir /srv/x revoke dev_1"
        );
    }
}
