//! `iris-gateway devices`: the paired devices, and revoking one.

use super::args::{DevicesAction, DevicesArgs};
use super::error::{data_dir, open_offline, refusal, require_store, CliError};
use crate::control::{self, ControlRequest, ControlResponse, Reached};
use crate::store::{Change, Device, DeviceOrigin, Record};

/// Lists the devices, or revokes one: through the running gateway (which also closes the
/// device's connection), or in the store when none runs.
pub fn run_devices(args: DevicesArgs) -> Result<(), CliError> {
    let dir = data_dir(args.data_dir);
    match args.action {
        None => {
            let devices = match control::request(&dir, &ControlRequest::Devices)? {
                Reached::Answer(ControlResponse::Devices { devices }) => devices,
                Reached::Answer(other) => return Err(refusal(other)),
                Reached::NotRunning => {
                    require_store(&dir)?;
                    open_offline(&dir)?.devices()?
                }
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
                Reached::Answer(other) => return Err(refusal(other)),
                Reached::NotRunning => {
                    require_store(&dir)?;
                    let store = open_offline(&dir)?;
                    // The gateway is not running: this command is the store's only writer.
                    let existed = store.device(&device_id)?.is_some();
                    let gone = Record::RemoveDevice(device_id.clone());
                    store.commit(&[Change::Record(gone)])?;
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

/// A table for a person, or a JSON array for a script.
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
        println!(
            "No devices are paired. Pair one with: {}",
            crate::hints::command("pair --name NAME")
        );
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
