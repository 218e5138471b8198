//! `iris-gateway config --effective`: every setting in effect and where it comes from.

use super::args::RunArgs;
use super::error::CliError;

/// `config --effective`: each setting in effect and where it came from.
pub fn run_config_effective(args: &RunArgs) -> Result<(), CliError> {
    let (config, dir, pinned) = args
        .resolve_pinned()
        .map_err(|e| CliError::Refused(e.to_string()))?;
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)?;
            Some(
                toml::from_str::<toml::Table>(&text)
                    .map_err(|e| CliError::Refused(format!("{}: {e}", path.display())))?,
            )
        }
        None => None,
    };
    let saved =
        crate::settings::Settings::load(&dir).map_err(|e| CliError::Refused(e.to_string()))?;
    println!("# Order: command-line flags > saved from the admin page > config file > defaults");
    match &args.config {
        Some(p) => println!("# config file: {}", p.display()),
        None => println!("# config file: none (--config not given)"),
    }
    println!(
        "# saved settings: {}",
        crate::settings::path(&dir).display()
    );
    for row in crate::settings::explain(&config, &pinned, file.as_ref(), &saved) {
        println!("{} = {}    ({})", row.key, row.value, row.source.label());
    }
    Ok(())
}
