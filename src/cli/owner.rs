//! `iris-gateway owner`: setting or removing the admin page's owner passphrase at the box.

use super::args::{OwnerAction, OwnerArgs};
use super::error::{data_dir, CliError};

/// `owner set` / `owner reset`.
pub fn run_owner(args: OwnerArgs) -> Result<(), CliError> {
    use crate::admin::owner;
    let dir = data_dir(args.data_dir);
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
pub(super) struct EchoOff(Option<libc::termios>);

impl EchoOff {
    /// Echo off now; nothing happens when stdin is not a terminal.
    pub(super) fn new() -> EchoOff {
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
