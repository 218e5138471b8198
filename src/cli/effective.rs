//! `iris-gateway config --effective`: every setting in effect and where it comes from, and
//! `config --check FILE`: whether the gateway takes a config file.
//!
//! The listing is the effective `Config` serialized (secrets serialize as `(set)` or
//! `(not set)`, see `config::Secret`), then the settings only the admin page saves, so a new
//! section or key is listed without touching this file.

use std::path::Path;

use serde_json::Value;

use super::args::RunArgs;
use super::error::{require_store, CliError};
use crate::config::{Config, Pinned};
use crate::settings::Settings;

/// Where one effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Default,
    File,
    Saved,
    Flag,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File => "config file",
            Source::Saved => "saved from the admin page",
            Source::Flag => "command-line flag",
        }
    }
}

/// One line of the listing: a dotted key (`limits.max_frame_bytes`, `cron[0].channel`), its
/// value as shown, its source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    key: String,
    value: String,
    source: Source,
}

/// `config --effective`: each setting in effect and where it came from.
pub fn run_config_effective(args: &RunArgs) -> Result<(), CliError> {
    let (config, dir, pinned) = args
        .resolve_pinned()
        .map_err(|e| CliError::Refused(e.to_string()))?;
    // A data dir with saved settings but no store yet (set up before the first start) is one.
    if !crate::settings::path(&dir).is_file() {
        require_store(&dir)?;
    }
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
    let saved = Settings::load(&dir).map_err(|e| CliError::Refused(e.to_string()))?;
    println!("# Order: command-line flags > saved from the admin page > config file > defaults");
    match &args.config {
        Some(p) => println!("# config file: {}", p.display()),
        None => println!("# config file: none (--config not given)"),
    }
    println!(
        "# saved settings: {}",
        crate::settings::path(&dir).display()
    );
    for row in listing(&config, &dir, &pinned, file.as_ref(), &saved) {
        println!("{} = {}    ({})", row.key, row.value, row.source.label());
    }
    Ok(())
}

/// `config --check FILE`: reads and validates a config file as `run` would (unknown keys,
/// values out of range), without a data dir or a start.
pub fn run_config_check(file: &Path) -> Result<(), CliError> {
    let config = Config::from_file(file).map_err(|e| CliError::Refused(e.to_string()))?;
    config
        .validate()
        .map_err(|e| CliError::Refused(format!("{}: {e}", file.display())))?;
    println!("{}: a config file the gateway takes", file.display());
    Ok(())
}

/// Every key of the effective config, then the keys only the admin page saves.
fn listing(
    config: &Config,
    dir: &Path,
    pinned: &Pinned,
    file: Option<&toml::Table>,
    saved: &Settings,
) -> Vec<Row> {
    let mut values = Vec::new();
    flatten(
        "",
        &serde_json::to_value(config).unwrap_or(Value::Null),
        &mut values,
    );
    // Values the gateway derives from an empty or absent one: what it uses, not what is written.
    let used = |key: &str, value: String| match key {
        "data_dir" => dir.display().to_string(),
        "agent.url" => config.agent.base_url(),
        "transcription.url" => config.transcription.base_url(),
        _ => value,
    };
    let saved_tree = serde_json::to_value(saved).unwrap_or(Value::Null);
    let is_saved = |key: &str| {
        lookup(&saved_tree, key).is_some_and(|v| !v.is_null())
            || (key == "push.fcm_credentials" && saved.push.fcm_credentials.is_some())
    };
    let file_tree = file
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(Value::Null);
    // A secret read from its file (`key_file`, `ntfy_token_file`) comes from the file too.
    let in_file = |key: &str| {
        lookup(&file_tree, key).is_some() || lookup(&file_tree, &format!("{key}_file")).is_some()
    };
    let mut rows: Vec<Row> = values
        .into_iter()
        .map(|(key, value)| {
            let source = if pinned.contains(&key) {
                Source::Flag
            } else if is_saved(&key) {
                Source::Saved
            } else if in_file(&key) {
                Source::File
            } else {
                Source::Default
            };
            let value = match used(&key, value) {
                derived if derived.is_empty() => "\"\"".to_owned(),
                shown => shown,
            };
            Row { key, value, source }
        })
        .collect();
    // What the admin page saves that has no config key (scheduled backups, the log's zone).
    let mut saved_only = Vec::new();
    flatten("", &saved_tree, &mut saved_only);
    for (key, value) in saved_only {
        if rows.iter().any(|r| r.key == key) {
            continue;
        }
        let source = match is_saved(&key) {
            true => Source::Saved,
            false => Source::Default,
        };
        rows.push(Row { key, value, source });
    }
    rows
}

/// `{"a": {"b": 1}}` → `a.b = 1`; lists of tables by index (`cron[0].channel`), an empty list
/// as `(none)`, an absent value as `(not set)`.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let join = |key: &str| match prefix {
        "" => key.to_owned(),
        _ => format!("{prefix}.{key}"),
    };
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                flatten(&join(key), v, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for (i, item) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), item, out);
            }
        }
        Value::Array(items) if items.is_empty() => out.push((prefix.to_owned(), "(none)".into())),
        Value::Null => out.push((prefix.to_owned(), "(not set)".into())),
        Value::String(s) if s.is_empty() => out.push((prefix.to_owned(), "\"\"".into())),
        Value::String(s) => out.push((prefix.to_owned(), s.clone())),
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}

/// The value at a dotted key, if the tree has it.
fn lookup<'a>(tree: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(tree, |node, part| node.get(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_says_where_it_came_from_and_no_secret_is_shown() {
        let dir = tempfile::tempdir().unwrap();
        let saved: Settings = toml::from_str(
            "[agent]\nbackend = \"openai\"\nkey = \"sk-saved\"\n[backup]\nschedule = \"daily\"\n",
        )
        .unwrap();
        let file: toml::Table =
            toml::from_str("[agent]\nmodel = \"m\"\n[push]\nntfy_token_file = \"/t\"\n").unwrap();
        let mut config: Config = toml::from_str("[agent]\nmodel = \"m\"\n").unwrap();
        saved.apply(&mut config);
        config.push.ntfy_token = Some("tk-secret".into());
        let pinned = Pinned(vec!["agent.url"]);
        let rows = listing(&config, dir.path(), &pinned, Some(&file), &saved);
        let row = |k: &str| rows.iter().find(|r| r.key == k).unwrap().clone();
        assert_eq!(row("agent.backend").source, Source::Saved);
        assert_eq!(row("agent.url").source, Source::Flag);
        assert_eq!(row("agent.model").source, Source::File);
        assert_eq!(row("push.backend").source, Source::Default);
        assert_eq!(row("push.ntfy_token").source, Source::File);
        assert_eq!(row("push.ntfy_token").value, "(set)");
        assert_eq!(row("agent.key").value, "(set)");
        assert_eq!(row("transcription.key").value, "(not set)");
        assert_eq!(row("backup.schedule").value, "daily");
        assert_eq!(row("backup.schedule").source, Source::Saved);
        assert_eq!(row("log.timezone").value, "(not set)");
        assert_eq!(row("data_dir").value, dir.path().display().to_string());
        let all = format!("{rows:?}");
        assert!(
            !all.contains("sk-saved") && !all.contains("tk-secret"),
            "{all}"
        );
    }
}
