//! The command line: what `iris-gateway` does besides running the gateway (`pair`, `devices`,
//! `status`, `chat`, `config --effective`, `owner`, `backup`, `restore`, `update`). The top of the house:
//! only the binary (src/main.rs) imports it, and it reaches the gateway through the control
//! socket's client (or opens the store itself when no gateway runs).

mod args;
mod backup;
mod chat;
mod chat_files;
mod devices;
mod effective;
mod error;
mod owner;
mod pair;
mod resolve;
mod restore_sealed;
mod status;
mod update;

pub use args::{
    BackupArgs, ChatArgs, Cli, Command, ConfigArgs, DevicesAction, DevicesArgs, OwnerAction,
    OwnerArgs, PairArgs, RestoreArgs, RunArgs, StatusArgs, UpdateAction, UpdateArgs,
};
pub use backup::{run_backup, run_restore};
pub use chat::ChatError;
pub use devices::run_devices;
pub use effective::{run_config_check, run_config_effective};
pub use error::CliError;
pub use owner::run_owner;
pub use pair::{pair, run_pair, Paired};
pub use status::{run_status, StatusOutcome};
pub use update::run_update;

/// `chat`: on a data dir (no `--url`), only where a gateway's store is: pairing through an
/// empty directory would make a store there that no gateway serves.
pub async fn run_chat(mut args: ChatArgs) -> Result<(), ChatError> {
    if args.url.is_none() {
        let dir = error::data_dir(args.data_dir.take());
        error::require_store(&dir)?;
        args.data_dir = Some(dir);
    }
    chat::run(args).await
}
