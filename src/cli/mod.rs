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
pub use chat::{run as run_chat, ChatError};
pub use devices::run_devices;
pub use effective::run_config_effective;
pub use error::CliError;
pub use owner::run_owner;
pub use pair::{pair, run_pair, Paired};
pub use status::{run_status, StatusOutcome};
pub use update::run_update;
