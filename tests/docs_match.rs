//! The docs match the gateway: the sample config files in README.md and docs/configuration.md
//! are files the binary takes, every doc they and `--help` point to exists, and
//! docs/configuration.md documents exactly the settings `config --effective` lists (which is
//! the config itself, serialized: a new setting not documented fails here).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo().join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// The bodies of the ```toml blocks of a Markdown text.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```toml") => current = Some(String::new()),
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn the_sample_config_files_are_files_the_gateway_takes() {
    let dir = temp_data_dir();
    for doc in ["README.md", "docs/configuration.md"] {
        let blocks = toml_blocks(&read(doc));
        assert!(!blocks.is_empty(), "{doc} has no ```toml sample");
        for (i, block) in blocks.iter().enumerate() {
            let file = dir.path().join(format!("sample-{i}.toml"));
            std::fs::write(&file, block).unwrap();
            let out = cli_os(&["config".as_ref(), "--check".as_ref(), file.as_os_str()]);
            assert!(
                out.status.success(),
                "{doc}'s sample #{} is refused: {}\n{block}",
                i + 1,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // And the check refuses what the gateway refuses.
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "agent = \"demo\"\n").unwrap();
    let out = cli_os(&["config".as_ref(), "--check".as_ref(), typo.as_os_str()]);
    assert!(!out.status.success(), "{out:?}");
}

/// Every relative Markdown link target (`](path)`, anchors cut) and every `docs/….md` named in
/// `text`, as paths to check: links relative to `base`, named docs to the repository.
fn pointed_to(text: &str, base: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for (at, _) in text.match_indices("](") {
        let target = text[at + 2..].split([')', '#', ' ']).next().unwrap_or("");
        let elsewhere = target.contains(':') || target.contains('…') || target.is_empty();
        if !elsewhere {
            paths.push(base.join(target));
        }
    }
    for (at, _) in text.match_indices("docs/") {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
            .collect();
        if let Some(end) = name.find(".md") {
            paths.push(repo().join(&name[..end + 3]));
        }
    }
    paths
}

#[test]
fn every_doc_the_readme_the_docs_and_help_point_to_exists() {
    let mut texts = vec![(
        PathBuf::from("README.md"),
        read("README.md"),
        repo().to_owned(),
    )];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&path).unwrap();
            texts.push((path, text, repo().join("docs")));
        }
    }
    let top = cli_ok(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 8, "{top}");
    texts.push(("--help".into(), top, repo().to_owned()));
    for command in &commands {
        let help = cli_ok(&[command, "--help"]);
        texts.push((format!("{command} --help").into(), help, repo().to_owned()));
    }
    let mut missing = Vec::new();
    for (source, text, base) in &texts {
        for path in pointed_to(text, base) {
            if !path.exists() {
                missing.push(format!("{} → {}", source.display(), path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "pointing nowhere:\n{}",
        missing.join("\n")
    );
}

#[test]
fn config_effective_lists_every_setting_and_configuration_md_documents_each() {
    let dir = temp_data_dir();
    // A data dir with saved settings (no store needed), and a config with one of each list.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("settings.toml"), "[backup]\nkeep = 3\n").unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[[cron]]\nchannel = \"News\"\nschedule = \"0 30 7 * * *\"\nprompt = \"News?\"\n\
         [[webhook]]\nname = \"door\"\nchannel = \"Home\"\ntoken = \"0123456789abcdef0123\"\n",
    )
    .unwrap();
    let listed_text = cli_ok(&[
        "config",
        "--effective",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let listed: BTreeSet<String> = listed_text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(" = ").next())
        // `cron[0].channel` is documented as `cron.channel`.
        .map(|k| k.replace("[0]", ""))
        .collect();
    assert!(
        listed.contains("limits.max_frame_bytes")
            && listed.contains("cron.schedule")
            && listed.contains("backup.keep"),
        "{listed_text}"
    );
    assert!(
        listed.len() > 100,
        "only {} settings:\n{listed_text}",
        listed.len()
    );
    assert!(
        listed_text.contains("webhook[0].token = (set)") && !listed_text.contains("0123456789"),
        "a secret is shown:\n{listed_text}"
    );

    let documented: BTreeSet<String> = read("docs/configuration.md")
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next().map(str::to_owned))
        .collect();
    let undocumented: Vec<_> = listed.difference(&documented).collect();
    let not_settings: Vec<_> = documented.difference(&listed).collect();
    assert!(
        undocumented.is_empty() && not_settings.is_empty(),
        "settings docs/configuration.md does not document: {undocumented:?}\n\
         documented but not settings: {not_settings:?}"
    );
}
