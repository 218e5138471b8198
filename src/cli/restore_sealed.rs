//! `iris-gateway restore FILE` for an encrypted scheduled backup (`backups/sealed.rs`): asks for
//! the backup passphrase and hands the file to the backups wing (`backups::restore_sealed`),
//! which opens it, restores it as `restore` does any backup, and only then puts back the
//! settings and the owner file it carried.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use crate::backups::{self, io, Error, Restored};

/// Restores the sealed backup `file` into `dir`; the passphrase from `passphrase_file`, else
/// asked at a terminal, else the first line of stdin.
pub(super) fn restore_sealed(
    dir: &Path,
    file: &Path,
    passphrase_file: Option<&Path>,
) -> Result<Restored, Error> {
    let passphrase = read_passphrase(passphrase_file)?;
    backups::restore_sealed(
        dir,
        file,
        &passphrase,
        crate::control::answering,
        &crate::admin::owner::path(dir),
        |put| println!("Restored {}.", put.display()),
    )
}

fn read_passphrase(file: Option<&Path>) -> Result<zeroize::Zeroizing<String>, Error> {
    let mut line = zeroize::Zeroizing::new(String::new());
    if let Some(f) = file {
        let text = zeroize::Zeroizing::new(
            std::fs::read_to_string(f).map_err(io(format!("cannot read {}", f.display())))?,
        );
        line.push_str(text.lines().next().unwrap_or(""));
        return Ok(line);
    }
    let stdin = std::io::stdin();
    let _echo_off = stdin.is_terminal().then(|| {
        eprint!("Backup passphrase: ");
        let _ = std::io::stderr().flush();
        super::owner::EchoOff::new()
    });
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(io("reading the backup passphrase"))?;
    let trimmed = line.trim_end_matches(['\r', '\n']).len();
    line.truncate(trimmed);
    Ok(line)
}
