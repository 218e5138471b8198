//! `iris-gateway status`: the running gateway's health, or a plain "not running".

use super::args::StatusArgs;
use super::error::{data_dir, open_offline, refusal, require_store, CliError};
use crate::control::{self, ControlRequest, ControlResponse, Reached};

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
    let dir = data_dir(args.data_dir);
    match control::request(&dir, &ControlRequest::Status)? {
        Reached::Answer(ControlResponse::Status { report }) => {
            if args.json {
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else {
                println!("{}", report.to_text());
            }
            Ok(StatusOutcome::Running)
        }
        Reached::Answer(other) => Err(refusal(other)),
        Reached::NotRunning => {
            require_store(&dir)?;
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
                println!(
                    "Start it with: sudo systemctl start iris-gateway (or {})",
                    crate::hints::command("run")
                );
            }
            Ok(StatusOutcome::NotRunning)
        }
    }
}
