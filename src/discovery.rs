//! LAN discovery: the gateway advertises itself with mDNS/DNS-SD, so the app can list the
//! gateways on its network instead of asking for an address.
//!
//! Service type `_iris-gw._tcp.local.`, instance "Iris on HOST" (or `[discovery] name`), host
//! `HOST.local.`, the listen port, and TXT records `v` (wire protocol version), `tls` (1 when
//! `wss://` is served), `plain` (1 when plain `ws://` is too) and, with TLS, `fp`: the
//! certificate's SHA-256 as 64 hex digits. The fingerprint is public (every TLS client sees the
//! certificate); an app must still not pin a fingerprint learnt this way, since anyone on the
//! LAN can advertise anything: the pin comes from the box (`pair`, its QR code, the pairing
//! page). See docs/security.md.
//!
//! mdns-sd answers queries on a thread of its own ("mDNS_daemon"): its socket work never runs
//! on, or blocks, the single-threaded event loop. The gateway only hands it the record at start
//! and takes it back (goodbye packets) at shutdown. Discovery is a convenience: when the
//! multicast socket cannot be opened or no interface takes the announcement, a warning is
//! logged and the gateway serves as usual.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mdns_sd::{DaemonEvent, IfKind, ServiceDaemon, ServiceInfo};
use tracing::{debug, info, warn};

use crate::config::DiscoveryConfig;

/// The DNS-SD service type the app browses for.
pub const SERVICE_TYPE: &str = "_iris-gw._tcp.local.";
/// How long after registering the monitor waits for a first announcement before warning that
/// none went out.
const ANNOUNCE_WAIT: Duration = Duration::from_secs(5);
/// Bound on each step of the shutdown (unregister, then stop the daemon thread), so a wedged
/// daemon can never hold up the gateway's exit.
const STOP_STEP_WAIT: Duration = Duration::from_secs(1);
/// mdns-sd repeats the goodbye 120 ms after the first one; the daemon must live that long.
const GOODBYE_REPEAT: Duration = Duration::from_millis(200);

/// A registered advertisement; [`Advertiser::stop`] withdraws it.
pub struct Advertiser {
    daemon: ServiceDaemon,
    fullname: String,
}

/// What to advertise, beyond the listen address.
pub struct Record<'a> {
    pub protocol_version: i64,
    pub tls: Option<&'a crate::tls::Advert>,
}

/// Starts advertising the gateway listening on `local`, or returns `None` (logged) when it is
/// not advertised: turned off, listening on loopback only (no phone could reach it), or the
/// mDNS thread could not start.
pub fn start(config: &DiscoveryConfig, local: SocketAddr, record: Record) -> Option<Advertiser> {
    if !config.enabled {
        info!("LAN discovery is off ([discovery] enabled = false)");
        return None;
    }
    if local.ip().is_loopback() {
        info!(%local, "not advertised on the LAN: the gateway listens on loopback only");
        return None;
    }
    let host = crate::lan::hostname().unwrap_or_else(|| "iris".to_owned());
    // A dotted host name (`pi.home.arpa`) contributes its first label, the part `.local` uses.
    let short = host.split('.').next().unwrap_or(&host).to_owned();
    let instance = if config.name.trim().is_empty() {
        format!("Iris on {short}")
    } else {
        config.name.trim().to_owned()
    };
    let mut txt = vec![
        ("v".to_owned(), record.protocol_version.to_string()),
        ("tls".to_owned(), flag(record.tls.is_some())),
        (
            "plain".to_owned(),
            flag(record.tls.is_none_or(|t| t.allow_plain)),
        ),
    ];
    if let Some(t) = record.tls {
        txt.push((
            "fp".to_owned(),
            crate::tls::compact_fingerprint(&t.fingerprint),
        ));
    }
    match register(&instance, &short, local, &txt) {
        Ok(advertiser) => {
            info!(name = %instance, service = SERVICE_TYPE, port = local.port(), "advertising on the LAN (mDNS)");
            Some(advertiser)
        }
        Err(e) => {
            warn!("LAN discovery unavailable, the app needs the address typed in or scanned: {e}");
            None
        }
    }
}

fn flag(on: bool) -> String {
    if on { "1" } else { "0" }.to_owned()
}

fn register(
    instance: &str,
    host: &str,
    local: SocketAddr,
    txt: &[(String, String)],
) -> Result<Advertiser, mdns_sd::Error> {
    let daemon = ServiceDaemon::new()?;
    // Only where the gateway can be reached: the interface of a specific listen address, or
    // every interface but loopback for an unspecified one (0.0.0.0 takes IPv4 only).
    match local.ip() {
        ip if ip.is_unspecified() => {
            daemon.disable_interface(vec![IfKind::LoopbackV4, IfKind::LoopbackV6])?;
            if ip.is_ipv4() {
                daemon.disable_interface(IfKind::IPv6)?;
            }
        }
        ip => {
            daemon.disable_interface(IfKind::All)?;
            daemon.enable_interface(IfKind::Addr(ip))?;
        }
    }
    let monitor = daemon.monitor()?;
    let addresses: Vec<IpAddr> = match local.ip() {
        ip if ip.is_unspecified() => Vec::new(),
        ip => vec![ip],
    };
    let info = ServiceInfo::new(
        SERVICE_TYPE,
        instance,
        &format!("{host}.local."),
        addresses.as_slice(),
        local.port(),
        txt,
    )?;
    // With an unspecified listen address, the daemon fills in each interface's own addresses
    // and follows them as DHCP changes them.
    let info = if addresses.is_empty() {
        info.enable_addr_auto()
    } else {
        info
    };
    let fullname = info.get_fullname().to_owned();
    daemon.register(info)?;
    watch(monitor);
    Ok(Advertiser { daemon, fullname })
}

/// Logs what the mDNS thread reports: the first announcement (or a warning when none goes out,
/// e.g. no multicast-capable interface or the socket could not be opened), errors, and renames
/// after a name conflict. Runs on its own small thread because the daemon's channel blocks;
/// it ends when the daemon does.
fn watch(monitor: mdns_sd::Receiver<DaemonEvent>) {
    let spawned = std::thread::Builder::new()
        .name("mdns-watch".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut announced = false;
            let deadline = std::time::Instant::now() + ANNOUNCE_WAIT;
            loop {
                let event = if announced {
                    monitor.recv().ok()
                } else {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    match monitor.recv_timeout(left) {
                        Ok(event) => Some(event),
                        Err(mdns_sd::RecvTimeoutError::Timeout) => {
                            warn!("LAN discovery: no interface took the mDNS announcement (no multicast-capable network, or the mDNS socket could not be opened); the app needs the address typed in or scanned");
                            announced = true;
                            continue;
                        }
                        Err(_) => None,
                    }
                };
                let Some(event) = event else { break };
                match event {
                    DaemonEvent::Announce(name, on) => {
                        if !announced {
                            info!("LAN discovery: announced {name} on {on}");
                        }
                        announced = true;
                    }
                    DaemonEvent::Error(e) => warn!("LAN discovery: {e}"),
                    DaemonEvent::NameChange(change) => info!(
                        "LAN discovery: {} was taken on the network; now advertised as {}",
                        change.original, change.new_name
                    ),
                    other => debug!("mDNS: {other:?}"),
                }
            }
        });
    if let Err(e) = spawned {
        warn!("LAN discovery: cannot watch the mDNS thread: {e}");
    }
}

impl Advertiser {
    /// Withdraws the advertisement (goodbye packets, so browsers drop it at once rather than
    /// after its TTL) and stops the mDNS thread. The waits run on a blocking-pool thread,
    /// never on the event loop, each bounded by [`STOP_STEP_WAIT`].
    pub async fn stop(self) {
        let Advertiser { daemon, fullname } = self;
        let stopped = tokio::task::spawn_blocking(move || {
            match daemon.unregister(&fullname) {
                Ok(status) => match status.recv_timeout(STOP_STEP_WAIT) {
                    Ok(status) => debug!("mDNS unregister: {status:?}"),
                    Err(e) => warn!("LAN discovery: no answer to unregister: {e}"),
                },
                Err(e) => warn!("LAN discovery: cannot unregister: {e}"),
            }
            std::thread::sleep(GOODBYE_REPEAT);
            if let Ok(done) = daemon.shutdown() {
                let _ = done.recv_timeout(STOP_STEP_WAIT);
            }
        });
        let _ = tokio::time::timeout(STOP_STEP_WAIT * 3, stopped).await;
        info!("LAN discovery: withdrawn");
    }
}
