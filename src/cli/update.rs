//! `iris-gateway update …`: the root helper's two entry points (`apply`, `recover`), and the
//! signer's tools (`keygen`, `bundle`, `verify`).

use std::path::{Path, PathBuf};

use super::args::{HelperArgs, UpdateAction, UpdateArgs};
use crate::config::Config;
use crate::control::{self, ControlRequest, ControlResponse, Reached};
use crate::update::helper::{Helper, Probe};
use crate::update::{bundle, keys, Error};

pub fn run_update(args: UpdateArgs) -> Result<(), Error> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
    match args.action {
        UpdateAction::Apply(h) => {
            match helper(&h)?.apply()? {
                Some(entry) => println!("{}", entry.summary()),
                None => println!("nothing staged"),
            }
            Ok(())
        }
        UpdateAction::Recover { helper: h, restart } => {
            if let Some(entry) = helper(&h)?.recover(restart)? {
                println!("{}", entry.summary());
            }
            Ok(())
        }
        UpdateAction::Keygen { file, comment } => keygen(&file, &comment),
        UpdateAction::Bundle {
            binary,
            version,
            arch,
            key,
            notes,
            out,
        } => {
            let text = std::fs::read_to_string(&key).map_err(|e| Error::io("reading", &key, e))?;
            let secret = keys::SecretKey::parse(&text)?;
            let m = bundle::write(&out, &binary, &version, &arch, &notes, &secret)?;
            println!(
                "{}: iris-gateway {} for {}",
                out.display(),
                m.version,
                m.arch
            );
            Ok(())
        }
        UpdateAction::Verify {
            bundle: b,
            keys_dir,
        } => {
            let v = bundle::verify(&b, &keys::trusted(&keys_dir))?;
            println!(
                "good: iris-gateway {} for {}, signed by {}",
                v.manifest.version, v.manifest.arch, v.signed_by
            );
            Ok(())
        }
    }
}

/// The helper over the config file's `[update]` section. Run as root, it runs the section's
/// stop and start commands: a config file anyone but root could change is refused.
fn helper(args: &HelperArgs) -> Result<Helper, Error> {
    refuse_unsafe_config(&args.config)?;
    let config = Config::from_file(&args.config).map_err(|e| Error::Helper(e.to_string()))?;
    let data_dir = args
        .data_dir
        .clone()
        .or_else(|| config.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from("/var/lib/iris-gateway"));
    Ok(Helper::new(config.update, data_dir, Box::new(probe)))
}

fn refuse_unsafe_config(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let meta = std::fs::metadata(path).map_err(|e| Error::io("reading", path, e))?;
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(Error::Helper(format!(
            "{} must be root's and writable only by root: the updater runs commands it names",
            path.display()
        )));
    }
    Ok(())
}

/// Asks the gateway on `data_dir` for its health: it answers on its control socket (so its
/// store is open and its event loop turns), and its store can be written.
fn probe(data_dir: &Path) -> Probe {
    match control::request(data_dir, &ControlRequest::Status) {
        Ok(Reached::Answer(ControlResponse::Status { report })) => match report.storage_error {
            Some(why) => Probe::NotYet(format!("its store cannot be written: {why}")),
            None => Probe::Healthy {
                version: report.version,
            },
        },
        Ok(Reached::Answer(other)) => Probe::NotYet(format!("it answered {other:?}")),
        Ok(Reached::NotRunning) => Probe::NotYet("nothing answered on its control socket".into()),
        Err(e) => Probe::NotYet(format!("its control socket: {e}")),
    }
}

fn keygen(file: &Path, comment: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (secret, text) = keys::SecretKey::generate()?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| Error::io("creating", file, e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io("writing", file, e))?;
    let mut public = file.as_os_str().to_owned();
    public.push(".pub");
    let line = secret.public(comment).to_line() + "\n";
    std::fs::write(&public, line).map_err(|e| Error::io("writing", Path::new(&public), e))?;
    println!(
        "secret key: {} (keep it off the box); public key: {}",
        file.display(),
        Path::new(&public).display()
    );
    Ok(())
}
