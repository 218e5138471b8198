//! Turns reach the hub only through their port: no file under `src/hub/turns/` names `Hub`, so
//! turn code is generic over `TurnPort` and the compiler holds it to that trait's methods
//! (docs/architecture.md, "Turns"). A turn file that takes a shortcut to a hub field fails here.

use std::path::Path;

/// The lines of `code` (line comments left out) that name the type `Hub`.
fn naming_hub(code: &str) -> Vec<String> {
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .filter(|code| {
            code.match_indices("Hub").any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + 3..].chars().next();
                let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !ident(before) && !ident(after)
            })
        })
        .map(|code| code.trim().to_owned())
        .collect()
}

#[test]
fn the_scanner_finds_a_named_hub_and_skips_comments_and_longer_names() {
    let code = "use super::super::state::Hub; // Hub\n// the Hub\nfn f(p: &HubPort, q: TheHub) {}\nlet h: Rc<Hub> = x;";
    assert_eq!(
        naming_hub(code),
        vec!["use super::super::state::Hub;", "let h: Rc<Hub> = x;"]
    );
}

#[test]
fn turn_code_names_no_hub() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/hub/turns");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("src/hub/turns holds the turns")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    assert!(files.len() > 5, "the turn files: {files:?}");
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            naming_hub(&std::fs::read_to_string(f).unwrap())
                .into_iter()
                .map(move |line| format!("{name}: {line}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "turn code reaches the hub past its port (TurnPort): {found:#?}"
    );
}
