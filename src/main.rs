//! The `iris-gateway` binary: parses the command line and starts the event loop.
//! The gateway itself is the library next to this file (src/lib.rs).

use clap::Parser;
use tracing_subscriber::filter::LevelFilter;

use iris_gateway::cli::{self, Cli, Command, RunArgs};
use iris_gateway::{server, service, store};

fn main() -> std::process::ExitCode {
    iris_gateway::memory::set_policy();
    let cli = Cli::parse();
    let result = match cli
        .command
        .unwrap_or_else(|| Command::Run(Box::new(cli.run)))
    {
        Command::Run(args) => run(*args),
        Command::Pair(args) => cli::run_pair(args).map_err(|e| e.to_string()),
        Command::Devices(args) => cli::run_devices(args).map_err(|e| e.to_string()),
        Command::Status(args) => match cli::run_status(args) {
            Ok(cli::StatusOutcome::Running) => Ok(()),
            Ok(cli::StatusOutcome::NotRunning) => return std::process::ExitCode::from(3),
            Err(e) => Err(e.to_string()),
        },
        Command::Chat(args) => {
            runtime().and_then(|rt| rt.block_on(cli::run_chat(args)).map_err(|e| e.to_string()))
        }
        Command::Config(args) => match &args.check {
            Some(file) => cli::run_config_check(file).map_err(|e| e.to_string()),
            None if args.effective => {
                cli::run_config_effective(&args.run).map_err(|e| e.to_string())
            }
            None => service::print_config_template().map_err(|e| e.to_string()),
        },
        Command::Owner(args) => cli::run_owner(args).map_err(|e| e.to_string()),
        Command::Backup(args) => cli::run_backup(args).map_err(|e| e.to_string()),
        Command::Restore(args) => cli::run_restore(args).map_err(|e| e.to_string()),
        Command::Update(args) => cli::run_update(args).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("iris-gateway: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> Result<(), String> {
    let (config, data_dir, pinned, switched_off) =
        args.resolve_for_run().map_err(|e| e.to_string())?;
    // The commands it prints (start-up lines, pages, errors) repeat the flags it runs with.
    iris_gateway::hints::Invocation::new(&data_dir, args.config.as_deref(), Some(config.listen))
        .install();
    init_logging(&config.log_level);
    iris_gateway::logring::take_kept(&data_dir);
    let rt = runtime()?;
    let local = tokio::task::LocalSet::new();
    let exit = local
        .block_on(
            &rt,
            server::run(config, data_dir.clone(), pinned, switched_off),
        )
        .map_err(|e| {
            // A damaged store: its own status, on which systemd does not restart (every try
            // would fail the same way, and copy the store first).
            if e.store_is_damaged() {
                eprintln!("iris-gateway: {e}");
                std::process::exit(store::EXIT_DAMAGED.into());
            }
            e.to_string()
        })?;
    // A clean stop or restart: the Log page's lines are kept for the next start.
    let kept = data_dir.join(iris_gateway::logring::KEPT_FILE);
    let text = iris_gateway::logring::to_keep();
    if let Err(e) = iris_gateway::atomic_file::write(&kept, &text, 0o600) {
        eprintln!("iris-gateway: cannot keep the log for the next start: {e}");
    }
    if exit == server::Exit::Restart {
        return restart_in_place();
    }
    Ok(())
}

/// Starts this binary again in this process (same PID for systemd, same arguments), with
/// nothing of the old one left: every file, socket and the store's lock are close-on-exec.
fn restart_in_place() -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("cannot restart: {e}"))?;
    eprintln!("iris-gateway: restarting");
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    Err(format!("cannot restart: {err}"))
}

/// The single-threaded runtime everything runs on: no worker threads to pay for on a Pi.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the event loop: {e}"))
}

/// Logs go to stderr (journald under systemd) and to the admin page's ring; `RUST_LOG` overrides
/// the configured level.
fn init_logging(level: &str) {
    let level = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_owned());
    let filter: LevelFilter = level.parse().unwrap_or(LevelFilter::INFO);
    // Plain text everywhere (tracing-subscriber is built without `ansi`: README, "Design notes"):
    // the journal, log files and the admin page's ring could not show colour codes anyway.
    // Also into the in-memory ring the admin page's Log shows (src/logring.rs).
    tracing_subscriber::fmt()
        .with_writer(iris_gateway::logring::make_writer)
        .with_max_level(filter)
        .with_target(false)
        .init();
}
