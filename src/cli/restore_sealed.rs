//! `iris-gateway restore FILE` for an encrypted scheduled backup (`backups/sealed.rs`): asks for
//! the backup passphrase, opens the file into a plain store backup in the data dir (a wrong
//! passphrase is refused before anything is written), restores that as `restore` does any
//! backup, and only then puts back the settings and the owner file it carried.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use crate::backups::sealed;
use crate::control::backup::{io, Error};
use crate::control::restore::{restore, Restored};

/// The opened store backup, in the data dir while it is restored; deleted after either way.
const OPENED: &str = ".restore-sealed.iris";

/// Restores the sealed backup `file` into `dir`; the passphrase from `passphrase_file`, else
/// asked at a terminal, else the first line of stdin.
pub(super) fn restore_sealed(
    dir: &Path,
    file: &Path,
    passphrase_file: Option<&Path>,
) -> Result<Restored, Error> {
    let passphrase = read_passphrase(passphrase_file)?;
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    let opened = dir.join(OPENED);
    let _ = std::fs::remove_file(&opened);
    let refused = |e: sealed::SealError| Error::Refused(e.to_string());
    let result = (|| {
        let extras = sealed::open(file, &passphrase, &opened).map_err(refused)?;
        sealed::check_extras(&extras, &file.display().to_string()).map_err(refused)?;
        let done = restore(dir, &opened)?;
        let put = |name: &Path, bytes: &Option<Vec<u8>>| -> Result<(), Error> {
            if let Some(b) = bytes {
                crate::atomic_file::write(name, b, 0o600)
                    .map_err(io(format!("cannot write {}", name.display())))?;
                println!("Restored {}.", name.display());
            }
            Ok(())
        };
        put(&crate::settings::path(dir), &extras.settings)?;
        put(&crate::admin::owner::path(dir), &extras.owner)?;
        Ok(done)
    })();
    let _ = std::fs::remove_file(&opened);
    result
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
