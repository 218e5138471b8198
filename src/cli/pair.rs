//! `iris-gateway pair`: a token for a new device (through the running gateway, or in the store
//! when none runs), or a one-time code for the gateway's pairing page.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::args::PairArgs;
use super::error::{data_dir, open_offline, refusal, CliError};
use crate::config::Config;
use crate::control::{self, ControlRequest, ControlResponse, Reached};
use crate::hub::new_device;
use crate::store::{Change, DeviceOrigin, Record};

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
        Reached::Answer(other) => Err(refusal(other)),
        Reached::NotRunning => {
            let store = open_offline(data_dir)?;
            let (device, token) = new_device(name, DeviceOrigin::Pair);
            // The gateway is not running: this command is the store's only writer.
            let put = Record::PutDevice(device.clone());
            store.commit(&[Change::Record(put)])?;
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
            Reached::Answer(other) => return Err(refusal(other)),
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

/// `pair`: mints the device and prints what the app needs (a QR code, or JSON for scripts).
pub fn run_pair(args: PairArgs) -> Result<(), CliError> {
    let dir = data_dir(args.data_dir);
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
            "The token is shown only now; revoke it with: {}",
            crate::hints::command(&format!("devices revoke {}", paired.device_id))
        );
    }
    Ok(())
}
