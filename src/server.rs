//! `iris-gateway run`: open the store, start the hub, listen, and shut down gracefully.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::agent::Agent;
use crate::board::BoardState;
use crate::config::Config;
use crate::control;
use crate::front;
use crate::hub::{new_device, Hub};
use crate::pairing::codes::PageCodes;
use crate::pairing::page::PairingPage;
use crate::settings::{Part, SwitchedOff};
use crate::shutdown::Shutdown;
use crate::store::{Change, DeviceOrigin, Record, Store, StoreError};

/// How long shutdown waits for every task to finish: devices to receive `status{restarting}`
/// and the close frame, the committer to write what it accepted, the rest to let go.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Uploads no message uses are collected at start once they are this old.
const UNUSED_UPLOAD_TTL_MS: i64 = 24 * 3600 * 1000;
/// How long `run` waits for a `pair` command that holds the store briefly.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot create the control socket in {dir}: {source}")]
    Control {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open media storage in {dir}: {source}")]
    Media {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS is misconfigured: {0}")]
    Tls(crate::tls::TlsError),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("could not close interrupted turns: {0}")]
    Recover(#[source] StoreError),
    #[error("cannot start automation: {0}")]
    Automation(#[from] crate::hub::AutomationError),
}

impl RunError {
    /// The store on disk is damaged, however the start met it: systemd must not retry (every
    /// start would fail alike), and the user copies the store first (`store::EXIT_DAMAGED`).
    pub fn store_is_damaged(&self) -> bool {
        matches!(
            self,
            RunError::Store(StoreError::Damaged { .. })
                | RunError::Recover(StoreError::Damaged { .. })
        )
    }
}

/// How `run` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM or SIGINT.
    Stopped,
    /// The admin page asked for a restart (a restore was uploaded): start again.
    Restart,
}

/// Runs the gateway until SIGTERM or SIGINT (or a restart the admin page asks for).
/// `pinned`: the settings flags set (the admin page's saved values do not override them);
/// `switched_off`: the parts whose saved settings could not be used (they start off, and the
/// gateway `degraded` with each as a cause, never refusing to start over them).
///
/// Four phases, in this order because each needs the one before: open what is on disk and start
/// the hub; finish what the last run left; open the doors (socket, pages, control, discovery);
/// serve until told to stop, then stop every task before the final flush.
pub async fn run(
    config: Config,
    data_dir: PathBuf,
    pinned: crate::config::Pinned,
    switched_off: Vec<SwitchedOff>,
) -> Result<Exit, RunError> {
    let shutdown = Shutdown::new();
    // Installed first: a SIGTERM that comes while the store opens (or the moment the
    // "listening" line is out) is kept, and ends the gateway gracefully once it serves.
    let signals = Signals::install()?;
    // Under systemd: READY once serving, WATCHDOG from this event loop, STOPPING on the way out.
    // systemd enforces the watchdog only after READY, so starting the pings early is harmless.
    let notifier = crate::service::Notifier::from_env().map(Rc::new);
    if let Some(n) = &notifier {
        let (n, mut stop) = (n.clone(), shutdown.listener());
        tokio::task::spawn_local(async move {
            tokio::select! {
                _ = crate::service::watchdog_task(n) => {}
                _ = stop.recv() => {}
            }
        });
    }
    // The committer stops after everything else, so it gets a shutdown of its own.
    let last = Shutdown::new();
    let core = open_core(config, &data_dir, pinned, switched_off, &shutdown, &last)?;
    recover(&core, &shutdown).await?;
    crate::store::kill_point("start-recovered", None);
    let doors = open_doors(&core, &data_dir, &shutdown).await?;
    if let Some(n) = &notifier {
        n.ready();
    }
    let exit = serve(&core, &doors, &shutdown, signals).await;
    info!("shutting down: telling devices the gateway is restarting");
    // A restart stays the same process (it execs itself, `main.rs`): systemd must not be told
    // it is stopping, or it would not take the new start's READY=1.
    if let (Some(n), Exit::Stopped) = (&notifier, exit) {
        n.stopping();
    }
    // Written once, here: the owner stays signed in over a restart or a reboot (`admin/session.rs`).
    doors.admin.save_sessions();
    stop(core, doors, [shutdown, last], &data_dir).await;
    Ok(exit)
}

/// What the gateway runs on once its store is open: the hub and what only the server holds.
struct Core {
    store: Store,
    hub: Rc<Hub>,
    agent: Rc<crate::agent::Switchable>,
    tls: Option<Rc<crate::tls::Tls>>,
    led: crate::board::LedHandle,
    /// The configuration as the gateway started: the doors read where to listen and what to
    /// advertise from it, and the admin page starts from it (below the flags in `pinned`).
    config: Config,
    pinned: crate::config::Pinned,
}

/// Opens the store, the agent, TLS, media and push, and starts the hub on them. A part whose
/// settings cannot work (the agent, push, transcription, speech) starts switched off instead.
fn open_core(
    config: Config,
    data_dir: &Path,
    pinned: crate::config::Pinned,
    mut switched_off: Vec<SwitchedOff>,
    shutdown: &Shutdown,
    last: &Shutdown,
) -> Result<Core, RunError> {
    // A restore uploaded from the admin page, before the store is opened (`backups/restore.rs`).
    let restore_failure = crate::backups::apply_pending_restore(data_dir, control::answering);
    crate::update::stage::Updates::remove_cut_part(data_dir);
    let store = Store::open(data_dir, config.store.cache_bytes, STORE_LOCK_WAIT)?;
    // The log kept at the last clean stop is in the ring now (`main.rs`); deleted only here,
    // after the store opened, so a refused start leaves every file as it was.
    let _ = std::fs::remove_file(data_dir.join(crate::logring::KEPT_FILE));
    if switched_off.iter().any(|off| off.part == Part::File) {
        set_aside_settings(data_dir);
    }
    info!(
        data_dir = %data_dir.display(),
        cursor = store.cursor_head()?,
        oldest_replayable = store.outbox_tail()?,
        bytes_on_disk = store.size_on_disk()?,
        "store open"
    );
    let agent = start_agent(&config, &mut switched_off);
    info!(agent = %agent.describe(), "agent backend ready");
    // The hub's agent can be replaced from the admin page; new turns then use the new one.
    let agent = Rc::new(crate::agent::Switchable::new(agent));
    let tls = crate::tls::setup(&config.tls, data_dir)
        .map_err(RunError::Tls)?
        .map(Rc::new);
    let live: std::collections::HashSet<String> = store.live_blobs()?.into_iter().collect();
    let media = crate::media::MediaFiles::open(
        data_dir,
        config.limits.max_media_bytes,
        config.limits.media_quota_bytes,
        Some(&live),
    )
    .map_err(|source| RunError::Media {
        dir: data_dir.join("media"),
        source,
    })?;
    info!(bytes = media.used(), "media storage open");
    let (outcomes_tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let pusher = crate::push::Pusher::start(&config.push, outcomes_tx).unwrap_or_else(|e| {
        switched_off.push(SwitchedOff {
            part: Part::Push,
            why: e.to_string(),
        });
        crate::push::Pusher::off()
    });
    let started_with = config.clone();
    let led_config = config.led.clone();
    let hub = Hub::start(
        store.clone(),
        media,
        pusher,
        config,
        agent.clone(),
        shutdown,
        last.listener(),
    )?;
    if let Some(why) = restore_failure {
        hub.status().note_restore_failure(why);
    }
    let transcriber = crate::agent::Transcriber::from_config(
        &started_with.transcription,
        started_with.limits.transcription_bytes,
    )
    .unwrap_or_else(|e| {
        switched_off.push(SwitchedOff {
            part: Part::Transcription,
            why: e.to_string(),
        });
        None
    });
    hub.turns().set_transcriber(transcriber);
    let speaker = crate::agent::Speaker::from_config(&started_with.speech).unwrap_or_else(|e| {
        switched_off.push(SwitchedOff {
            part: Part::Speech,
            why: e.to_string(),
        });
        None
    });
    hub.turns().set_speaker(speaker);
    for off in switched_off {
        hub.status().note_switched_off(off);
    }
    // The LED shows `starting` until the gateway listens, then follows the health state.
    let led = crate::board::spawn(&led_config, BoardState::Starting, hub.watch_health());
    {
        let (hub, mut stop) = (hub.clone(), shutdown.listener());
        tokio::task::spawn_local(async move {
            loop {
                tokio::select! {
                    outcome = outcomes.recv() => match outcome {
                        Some(outcome) => hub.push().outcome(outcome).await,
                        None => break,
                    },
                    _ = stop.recv() => break,
                }
            }
        });
    }
    Ok(Core {
        store,
        hub,
        agent,
        tls,
        led,
        config: started_with,
        pinned,
    })
}

/// The agent the settings name, or one that is off and says why when they cannot work.
fn start_agent(config: &Config, switched_off: &mut Vec<SwitchedOff>) -> Rc<dyn Agent> {
    let refused = switched_off
        .iter()
        .find(|off| off.part == Part::Agent)
        .map(|off| off.why.clone());
    let why = match refused {
        Some(why) => why,
        None => match crate::agent::from_config(config) {
            Ok(agent) => return agent,
            Err(e) => {
                let why = e.to_string();
                switched_off.push(SwitchedOff {
                    part: Part::Agent,
                    why: why.clone(),
                });
                why
            }
        },
    };
    Rc::new(crate::agent::OffAgent::new(why))
}

/// Moves saved settings this start could not read out of the pages' way (they save afresh),
/// keeping them for the owner to look at.
fn set_aside_settings(data_dir: &Path) {
    let from = crate::settings::path(data_dir);
    let mut to = from.clone().into_os_string();
    to.push(crate::settings::SET_ASIDE);
    match std::fs::rename(&from, &to) {
        Ok(()) => warn!(
            "the saved settings could not be read; they were set aside as {}",
            Path::new(&to).display()
        ),
        Err(e) => warn!("could not set the unreadable saved settings aside: {e}"),
    }
}

/// Finishes what the last run left: pushes still owed, uploads nothing used, turns interrupted
/// by the stop; then starts automation, so its channels exist before any device can look.
async fn recover(core: &Core, shutdown: &Shutdown) -> Result<(), RunError> {
    let hub = &core.hub;
    hub.push().catch_up();
    // Uploads acked but never sent in a message would hold their quota forever.
    let stale = core
        .store
        .media_older_than(crate::ids::now_ms() - UNUSED_UPLOAD_TTL_MS)?;
    hub.media().collect(&stale).await;
    let closed = hub
        .turns()
        .close_interrupted()
        .await
        .map_err(RunError::Recover)?;
    if closed > 0 {
        warn!("{closed} message(s) were waiting for an answer when the gateway stopped; their lanes now say so");
    }
    hub.automation().start(shutdown).await?;
    Ok(())
}

/// Everything the gateway is reached through, open and announced.
struct Doors {
    listener: TcpListener,
    pairing: Rc<PairingPage>,
    admin: Rc<crate::admin::Admin>,
    /// The mDNS advertisement, withdrawn first on the way out.
    advertised: Option<crate::discovery::Advertiser>,
}

/// Binds the socket, builds the pairing and admin pages, starts the control socket, prints how
/// to reach the gateway and advertises it on the LAN.
async fn open_doors(core: &Core, data_dir: &Path, shutdown: &Shutdown) -> Result<Doors, RunError> {
    let listen = core.config.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| RunError::Listen {
        addr: listen,
        source,
    })?;
    let (url, tls_advert) = crate::tls::pairing(core.tls.as_deref(), local, data_dir);
    let pairing = {
        let limits = core.hub.limits();
        let codes = PageCodes::new(
            Duration::from_secs(limits.pair_code_ttl_secs),
            limits.pair_code_failures_per_minute,
        );
        Rc::new(PairingPage::new(codes, url.clone(), tls_advert.clone()))
    };
    let backups = Rc::new(crate::backups::Backups::new(
        data_dir.to_path_buf(),
        crate::admin::owner::path(data_dir),
    ));
    let admin = Rc::new(crate::admin::Admin::new(
        data_dir.to_path_buf(),
        core.config.clone(),
        core.pinned.clone(),
        core.agent.clone(),
        url.clone(),
        tls_advert.clone(),
        backups.clone(),
    ));
    backups.start_schedule(core.hub.clone(), shutdown.listener());
    crate::update::checks::start(
        admin.update_checks(),
        crate::admin::CheckHost::new(&admin, core.hub.clone()),
        shutdown.listener(),
    );
    crate::admin::start_sampling(&admin, shutdown.listener());
    let control = control::bind(data_dir).map_err(|source| RunError::Control {
        dir: data_dir.to_path_buf(),
        source,
    })?;
    {
        tokio::task::spawn_local(control::serve(
            control,
            core.hub.clone(),
            url.clone(),
            tls_advert.clone(),
            pairing.clone(),
            shutdown.listener(),
        ));
    }
    // Tests and scripts wait for this exact line on stdout.
    println!("listening on ws://{local}");
    if let Some(t) = &core.tls {
        let plain = if t.allow_plain {
            ""
        } else {
            "; plain ws:// is refused"
        };
        let fp = &t.fingerprint;
        println!("listening on wss://{local} (same port; certificate SHA-256 {fp}{plain})");
    }
    core.led.show(core.hub.health().into());
    print_pairing_hint(&core.hub, data_dir, &url, tls_advert.as_ref()).await;
    print_page_code(&pairing);
    print_admin_hint(data_dir, &url, tls_advert.as_ref());
    let advertised = crate::discovery::start(
        &core.config.discovery,
        local,
        crate::discovery::Record {
            protocol_version: crate::protocol::PROTOCOL_VERSION,
            tls: tls_advert.as_ref(),
        },
    );
    info!(%local, "gateway online");
    Ok(Doors {
        listener,
        pairing,
        admin,
        advertised,
    })
}

/// SIGTERM (systemd's stop) and SIGINT (Ctrl-C), either of which stops the gateway gracefully.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, RunError> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(RunError::Signals)?,
            int: signal(SignalKind::interrupt()).map_err(RunError::Signals)?,
        })
    }
}

/// Accepts connections until SIGTERM, SIGINT or the admin page's restart.
async fn serve(core: &Core, doors: &Doors, shutdown: &Shutdown, mut signals: Signals) -> Exit {
    let restart = doors.admin.restart.clone();
    let limits = core.hub.limits();
    let admission = front::Admission::new(limits.max_connections, limits.max_connections_per_ip);
    loop {
        tokio::select! {
            accepted = doors.listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Counted from accept, not from hello: sockets that never say hello cost memory too.
                // Over a limit (in all, or from this address), the socket is closed unread.
                let Some(admitted) = admission.admit(peer.ip()) else {
                    drop(tcp);
                    continue;
                };
                let (hub, tls, pairing) = (core.hub.clone(), core.tls.clone(), doors.pairing.clone());
                let admin = doors.admin.clone();
                let done = shutdown.listener();
                // One HTTP connection: a WebSocket upgrade becomes a device session, a webhook,
                // or the pairing page.
                tokio::task::spawn_local(async move {
                    front::serve(hub, tcp, peer, tls, pairing, admin, done).await;
                    drop(admitted);
                });
            }
            _ = signals.term.recv() => return Exit::Stopped,
            _ = signals.int.recv() => return Exit::Stopped,
            _ = restart.notified() => return Exit::Restart,
        }
    }
}

/// The way out: no new connections, the LAN told, every device told and closed, every task
/// stopped (or the bound reached), then the committer once its queue is empty, then the final
/// flush and the clean-stop witness. `stages` are completed in order, each within the bound.
async fn stop(core: Core, doors: Doors, stages: [Shutdown; 2], data_dir: &Path) {
    let Doors {
        listener,
        advertised,
        ..
    } = doors;
    drop(listener);
    // Withdrawn while the devices are told, so browsers drop the gateway at once.
    let withdrawn = advertised.map(|a| tokio::task::spawn_local(a.stop()));
    core.hub.begin_shutdown();
    for stage in stages {
        if let Err(lingering) = stage.complete(SHUTDOWN_GRACE).await {
            warn!("{lingering}; flushing anyway");
        }
    }
    if let Some(withdrawn) = withdrawn {
        let _ = withdrawn.await;
    }
    let _ = std::fs::remove_file(control::socket_path(data_dir));
    if let Err(e) = core.store.close_cleanly() {
        error!("final flush failed: {e}");
    }
    core.led.stop().await;
    info!("stopped");
}

/// The name of the device whose token `run` prints at start (docs/security.md): what the
/// owner reads in the device list.
pub const SET_UP_DEVICE_NAME: &str = "Set-up device (printed at start)";

/// With no device paired yet, prints a fresh pairing code so a newcomer can connect at once.
/// It belongs to one set-up device, kept under the same id from start to start: each start
/// gives it a new token (only the latest printed one works), and once any device has
/// connected, an unused set-up device is removed at the next start, so the device list holds
/// only what the owner uses. Not when stdout is the journal: the device would keep that
/// token for good, and the journal keeps it readable (by the `adm` group too) long after.
async fn print_pairing_hint(
    hub: &Hub,
    data_dir: &std::path::Path,
    url: &str,
    tls: Option<&crate::tls::Advert>,
) {
    let devices = hub.store().devices().unwrap_or_default();
    let unused_set_up =
        |d: &&crate::store::Device| d.origin == DeviceOrigin::Startup && d.last_seen_ms.is_none();
    let stale: Vec<Change> = devices
        .iter()
        .filter(unused_set_up)
        .map(|d| Change::Record(Record::RemoveDevice(d.device_id.clone())))
        .collect();
    if devices.iter().any(|d| d.last_seen_ms.is_some()) {
        if !stale.is_empty() {
            if let Err(e) = hub.commit(stale, None).await {
                warn!("could not remove the unused set-up device: {e}");
            }
        }
        println!(
            "pair another device with: {}",
            crate::hints::command("pair --name NAME")
        );
        return;
    }
    if crate::service::stdout_is_journal() {
        // Typed at a shell, where systemd's STATE_DIRECTORY (the service's default) is not set.
        let pair = crate::hints::Invocation::on(data_dir).command("pair --name NAME");
        println!("no device is paired yet; pair one with: sudo -u iris-gateway {pair}");
        println!("(tokens are never written to the journal)");
        return;
    }
    // The first unused set-up device keeps its id with a new token; any other goes. Each is
    // removed first, also the one put back: a removal is what forgets its old token.
    let (mut device, token) = new_device(SET_UP_DEVICE_NAME, DeviceOrigin::Startup);
    if let Some(old) = devices.iter().find(unused_set_up) {
        device.device_id = old.device_id.clone();
        device.created_ms = old.created_ms;
    }
    let mut changes = stale;
    changes.push(Change::Record(Record::PutDevice(device)));
    if let Err(e) = hub.commit(changes, None).await {
        warn!("could not mint a pairing code: {e}");
        return;
    }
    // The code first, as `pair` draws it, so the text stays in view below it.
    let invitation = crate::pairing::Invitation::new(url, &token, tls);
    println!("no device is paired yet; scan this in the Iris app, or enter what follows it:");
    println!("{}", invitation.terminal_qr());
    println!("  url:   {url}");
    println!("  token: {token}");
    if let Some(t) = tls {
        println!("  TLS:   {} with certificate SHA-256", t.url);
        println!("         {}", t.fingerprint);
    }
    println!(
        "or try it from a terminal: {}",
        crate::hints::command("chat")
    );
}

/// The pairing page issues the codes `pair --page` asks the control socket for; the two doors
/// do not know each other, so they meet here, where both are wired.
impl control::PageCodeIssuer for PairingPage {
    fn issue(&self) -> control::PageCode {
        control::PageCode {
            code: self.codes.mint(),
            page_url: self.address(),
            expires_in: self.codes.ttl(),
        }
    }
}

/// A one-time code for the pairing page, at every start. Unlike a token it may go to the
/// journal: it works once, for `limits.pair_code_ttl_secs`, and is replaced by any newer one,
/// so a reader of old logs gains nothing (docs/security.md).
fn print_page_code(page: &PairingPage) {
    let code = page.codes.mint();
    let minutes = crate::pairing::page::ttl_minutes(page.codes.ttl());
    println!(
        "pairing page: {} code {code} (works once, for {minutes} minutes; a fresh one: {})",
        page.address(),
        crate::hints::command("pair --page")
    );
}

/// Where the owner's web page is, and whether it still waits to be claimed.
fn print_admin_hint(data_dir: &std::path::Path, url: &str, tls: Option<&crate::tls::Advert>) {
    let address = crate::admin::address(url, tls);
    match crate::admin::owner::load(data_dir) {
        Ok(Some(_)) => println!("admin page: {address}"),
        Ok(None) => println!(
            "admin page: {address} (no owner yet: the first to open it sets the passphrase; \
             or claim it here with {})",
            crate::hints::command("owner set")
        ),
        Err(e) => warn!("admin page: {e}"),
    }
}
