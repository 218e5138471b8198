//! The house rule, checked: the crate's modules form layers, and no module imports from a layer
//! above its own (docs/architecture.md, "Layers"). Read from the source text, so a new `use` that
//! climbs, or a new module nobody placed, fails here before review has to catch it.
//!
//! Two rules:
//! 1. Between top-level modules, an import may only go to a lower tier ([`TIERS`]); modules on one
//!    tier do not import each other. A module missing from the table fails: placing it is a
//!    decision, not a default.
//! 2. No import cycle among files. A child's use of its own folder's `mod.rs` (`super::Thing`) is
//!    not counted as a cycle with that `mod.rs` declaring and re-exporting the child: a folder's face
//!    is its namespace. Every other loop (siblings, or across folders) is.
//!
//! What counts as an import: every `crate::`, `super::` and `self::` path, in `use` trees and inline,
//! outside comments, string literals and `#[cfg(test)]` modules (unit tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A module may import only from tiers before its own.
const TIERS: &[&[&str]] = &[
    // Leaves: plain data and small pure helpers, importing nothing of the crate.
    &[
        "ids",
        "atomic_file",
        "disk",
        "logring",
        "shutdown",
        "command",
        "memory",
        "units",
        "web",
    ],
    &["config", "lan", "system_health"],
    // The wire format and the small policies over plain data.
    &[
        "protocol",
        "guessing",
        "settings",
        "service",
        "http_client",
        "approval",
        "hints",
    ],
    // What the hub drives; siblings, never importing each other.
    &["store", "agent", "push", "media", "board", "tls", "outlet"],
    // Signed updates: the gateway's staging and the root helper, over the store's file names.
    &["update"],
    &["hub"],
    // The backups wing: making, sealing, scheduling and restoring a backup, over the hub and the
    // store; the doors (control socket, admin page, command line) call it.
    &["backups"],
    // Doors other than the app's socket; pairing's codes and page are what the others open.
    &["pairing"],
    &["control", "discovery"],
    // One device's WebSocket: given the hub (and the outlet it drains), knowing no HTTP.
    &["session"],
    &["admin"],
    // The port's front door: routes a request to a session, the admin page, pairing or a webhook.
    &["front"],
    &["server"],
    &["cli"],
];

/// One import as written: which file, which line, the path it names.
#[derive(Debug, Clone)]
struct Import {
    line: usize,
    path: Vec<String>,
}

/// A source file and the module path it defines (`src/hub/turn_run.rs` → `["hub", "turn_run"]`).
struct SourceFile {
    file: PathBuf,
    module: Vec<String>,
    imports: Vec<Import>,
}

fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_owned());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with comments, string and char literals blanked (newlines kept, so line numbers
/// stay true), and `#[cfg(test)]` items removed.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // Raw string r"..." / r#"..."#: ends at a quote followed by as many #s.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"'); a lifetime ('a) is left alone.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    let code = String::from_utf8(out).expect("ascii blanks keep utf-8");
    without_test_items(&code)
}

/// Blanks every item that follows a `#[cfg(test)]` attribute, up to its closing brace or `;`.
fn without_test_items(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(p) = code[from..].find("#[cfg(test)]") {
        let start = from + p;
        let bytes = code.as_bytes();
        let mut i = start;
        let mut depth = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                b';' if depth == 0 => break,
                _ => {}
            }
            i += 1;
        }
        for x in &mut out[start..(i + 1).min(bytes.len())] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = i + 1;
        if from >= code.len() {
            break;
        }
    }
    String::from_utf8(out).expect("ascii blanks keep utf-8")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`crate::{a::{b, c as d}, e::*}`) into the paths it names.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    parse(s, i, &path, out);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && (is_ident(s[*i]) || s[*i] == '*') {
                *i += 1;
            }
            let seg: String = s[start..*i].iter().collect();
            if !seg.is_empty() && seg != "self" && seg != "*" {
                path.push(seg);
            }
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            // `as name`: the rename does not change what is imported.
            if s[*i..].starts_with(&['a', 's']) && s.get(*i + 2).is_some_and(|c| c.is_whitespace())
            {
                *i += 2;
                while *i < s.len() && s[*i].is_whitespace() {
                    *i += 1;
                }
                while *i < s.len() && is_ident(s[*i]) {
                    *i += 1;
                }
            }
            out.push(path);
            return;
        }
    }
    let chars: Vec<char> = tree.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    parse(&chars, &mut i, &[], &mut out);
    out
}

fn line_at(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

/// Every path rooted at `crate`, `super` or `self` (or at a child module of this file) that the
/// code names, with its line.
fn imports_of(code: &str, children: &BTreeSet<String>) -> Vec<Import> {
    let mut found = Vec::new();
    let mut in_use = vec![false; code.len()];
    let mut from = 0;
    while let Some(p) = code[from..].find("use ") {
        let at = from + p;
        from = at + 4;
        let before = code[..at].chars().next_back();
        if before.is_some_and(is_ident) {
            continue;
        }
        let Some(end) = code[at..].find(';').map(|e| at + e) else {
            break;
        };
        for flag in &mut in_use[at..end] {
            *flag = true;
        }
        for path in expand_use_tree(&code[at + 4..end]) {
            let rooted = path.first().is_some_and(|r| {
                r == "crate" || r == "super" || r == "self" || children.contains(r)
            });
            if rooted {
                found.push(Import {
                    line: line_at(code, at),
                    path,
                });
            }
        }
        from = end;
    }
    // Inline paths (`crate::store::Store::open(..)`), outside `use` statements.
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(p) = code[from..].find(root) {
            let at = from + p;
            from = at + root.len();
            if in_use[at] || code[..at].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            // `pub(in crate::store)` names where an item is visible, not something it uses.
            if code[..at].trim_end().ends_with("(in") {
                continue;
            }
            let tail: String = code[at..]
                .chars()
                .take_while(|&c| is_ident(c) || c == ':')
                .collect();
            let path: Vec<String> = tail
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            found.push(Import {
                line: line_at(code, at),
                path,
            });
        }
    }
    found
}

/// The child modules a file declares (`mod x;` / `pub mod x;`), which its own paths may start at.
fn declared_children(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if let Some(rest) = t.strip_prefix("mod ") {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn read_tree(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            let code = code_only(&text);
            let children = declared_children(&code);
            SourceFile {
                module: module_of(src, &file),
                imports: imports_of(&code, &children),
                file,
            }
        })
        .collect()
}

/// The module an import lands in: the longest prefix of its absolute path that is a file.
fn resolve(
    from: &SourceFile,
    path: &[String],
    modules: &BTreeMap<Vec<String>, usize>,
) -> Option<usize> {
    let mut abs: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") => {
            abs = from.module.clone();
            rest = &path[1..];
        }
        Some("super") => {
            abs = from.module.clone();
            while rest.first().map(String::as_str) == Some("super") {
                abs.pop();
                rest = &rest[1..];
            }
        }
        // A child module named without `self::` (`pub use state::Hub;` in a mod.rs).
        Some(_) => abs = from.module.clone(),
        None => return None,
    }
    abs.extend(rest.iter().cloned());
    (1..=abs.len())
        .rev()
        .find_map(|n| modules.get(&abs[..n]).copied())
}

struct Verdict {
    upward: Vec<String>,
    cycles: Vec<Vec<String>>,
    unplaced: BTreeSet<String>,
}

fn tier_of(module: &str, tiers: &[&[&str]]) -> Option<usize> {
    tiers.iter().position(|t| t.contains(&module))
}

fn judge(src: &Path, tiers: &[&[&str]]) -> Verdict {
    let files = read_tree(src);
    let modules: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let mut upward = Vec::new();
    let mut unplaced = BTreeSet::new();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); files.len()];
    for (i, f) in files.iter().enumerate() {
        // The crate root and the binary declare and wire everything; they are above every tier.
        if f.module.is_empty() {
            continue;
        }
        let top = &f.module[0];
        if tier_of(top, tiers).is_none() {
            unplaced.insert(top.clone());
        }
        for imp in &f.imports {
            let Some(j) = resolve(f, &imp.path, &modules) else {
                continue;
            };
            if j == i {
                continue;
            }
            let target = &files[j].module;
            if target.is_empty() {
                continue;
            }
            // A child naming its own folder's face (`super::X` into an ancestor mod.rs).
            let into_ancestor = target.len() < f.module.len() && f.module.starts_with(target);
            if !into_ancestor {
                edges[i].insert(j);
            }
            let (ta, tb) = (tier_of(top, tiers), tier_of(&target[0], tiers));
            if let (Some(a), Some(b)) = (ta, tb) {
                if target[0] != *top && b >= a {
                    upward.push(format!(
                        "{}:{}: `{}` (tier {a}) imports `{}` (tier {b})",
                        f.file.display(),
                        imp.line,
                        top,
                        imp.path.join("::"),
                    ));
                }
            }
        }
    }
    let cycles = strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c
                .iter()
                .map(|&i| files[i].file.display().to_string())
                .collect();
            names.sort();
            names
        })
        .collect();
    Verdict {
        upward,
        cycles,
        unplaced,
    }
}

/// Tarjan's algorithm, iterative: the strongly connected components of a small graph.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut out = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, Vec<usize>)> =
            vec![(root, edges[root].iter().copied().collect())];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some((v, pending)) = work.last_mut() {
            let v = *v;
            if let Some(w) = pending.pop() {
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, edges[w].iter().copied().collect()));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
            } else {
                work.pop();
                if let Some((parent, _)) = work.last() {
                    low[*parent] = low[*parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = Vec::new();
                    loop {
                        let w = stack.pop().expect("on the stack");
                        on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    out.push(component);
                }
            }
        }
    }
    out
}

#[test]
fn every_import_runs_down_the_layers_and_no_files_import_each_other_in_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let verdict = judge(&src, TIERS);
    let mut report = String::new();
    if !verdict.unplaced.is_empty() {
        report += &format!(
            "modules on no tier (place them in TIERS and docs/architecture.md): {:?}\n",
            verdict.unplaced
        );
    }
    for u in &verdict.upward {
        report += &format!("import against the layers: {u}\n");
    }
    for c in &verdict.cycles {
        report += &format!("import cycle among {} files: {}\n", c.len(), c.join(", "));
    }
    assert!(report.is_empty(), "\n{report}");
}

/// The checker itself must see what it is for: a tree with an upward import, a sibling loop and an
/// unplaced module fails on each, and the same tree set right passes.
#[test]
fn the_check_catches_an_upward_import_a_loop_and_an_unplaced_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod low;\npub mod high;\npub mod stray;\n");
    write(
        "low.rs",
        "// use crate::high::Nothing; (a comment is not an import)\n\
         const S: &str = \"crate::high::Str\";\n\
         pub fn f() { crate::high::g(); }\n",
    );
    write(
        "high/mod.rs",
        "mod a;\nmod b;\npub use a::A;\nuse crate::low::f;\npub fn g() {}\n\
         #[cfg(test)]\nmod tests { use crate::stray::X; }\n",
    );
    write(
        "high/a.rs",
        "use super::b::B;\nuse super::g;\npub struct A;\n",
    );
    write("high/b.rs", "use super::{a::A, g};\npub struct B;\n");
    write("stray.rs", "use crate::{low::{self, f as ff}};\n");
    let tiers: &[&[&str]] = &[&["low"], &["high"]];
    let v = judge(src, tiers);
    assert_eq!(v.unplaced, BTreeSet::from(["stray".to_owned()]));
    assert_eq!(v.upward.len(), 1, "{:?}", v.upward);
    assert!(v.upward[0].contains("low.rs:3"), "{:?}", v.upward);
    // The sibling loop, and the loop the upward call makes with the downward import back.
    let mut cycles: Vec<Vec<String>> = v
        .cycles
        .iter()
        .map(|c| {
            c.iter()
                .map(|f| f[src.to_str().unwrap().len() + 1..].to_owned())
                .collect()
        })
        .collect();
    cycles.sort();
    assert_eq!(
        cycles,
        [
            vec!["high/a.rs", "high/b.rs"],
            vec!["high/mod.rs", "low.rs"]
        ],
    );

    // Set right: low no longer calls up, b no longer names a, stray placed.
    write("low.rs", "pub fn f() {}\n");
    write("high/b.rs", "use super::g;\npub struct B;\n");
    let tiers: &[&[&str]] = &[&["low"], &["high"], &["stray"]];
    let v = judge(src, tiers);
    assert!(v.unplaced.is_empty() && v.upward.is_empty() && v.cycles.is_empty());
}

/// Where `Store::commit` may be called: the hub's committer (the one write path while the
/// gateway runs), the offline commands (the gateway is not running, so they are the store's
/// only writer) and the store itself (its own tests and the writes a start makes before the
/// doors open).
const COMMITTERS: &[&str] = &["hub/commit.rs", "cli/", "store/"];

/// The files under `src` (relative, `/`-separated) whose code (comments, strings and test
/// modules left out) calls `.commit(&`, the store's commit (the hub's takes a `Vec`).
fn store_committers(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            without_test_items(&code_only(&text)).contains(".commit(&")
        })
        .map(|f| {
            f.strip_prefix(src)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    found.sort();
    found
}

/// One write path: nothing but the committer (and the offline commands) writes to the store
/// through `Store::commit`, so "sent only after durable" holds by construction.
#[test]
fn only_the_committer_commits_to_the_store() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = store_committers(&src);
    let outside: Vec<&String> = found
        .iter()
        .filter(|f| !COMMITTERS.iter().any(|c| f.starts_with(c)))
        .collect();
    assert!(
        outside.is_empty(),
        "Store::commit called outside the committer: {outside:?}"
    );
    // The check sees what it is for.
    assert!(found.iter().any(|f| f == "hub/commit.rs"), "{found:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("admin")).unwrap();
    std::fs::write(
        dir.path().join("admin/forms.rs"),
        "fn f(s: &Store) { s.commit(&[]).unwrap(); }\n",
    )
    .unwrap();
    assert_eq!(store_committers(dir.path()), ["admin/forms.rs"]);
}

/// The store's rooms (docs/architecture.md, "The store"), in the order a start after a power cut
/// walks them: a room may import only from rooms after its own. A room is a file of `src/store`
/// (`store/x.rs` is `x`, `store/engine/x.rs` is `engine/x`); the faces `mod` (`store/mod.rs`) and
/// `engine` (`store/engine/mod.rs`) only declare rooms and re-export, so they come first and
/// nothing imports them: every room names the file an item lives in, and the order below is
/// the whole of the store's dependencies, with no exemption to hide a loop behind.
/// A file of `src/store` missing here fails, as a module missing from [`TIERS`] does.
const STORE_ROOMS: &[&str] = &[
    // The faces.
    "mod",
    "engine",
    // The read-only handle the doors above the hub get (`Hub::store`), and the backup format.
    "view",
    "backup",
    // The subjects that read through the handle and commit through the engine.
    "directory",
    "outbox",
    "search",
    "history",
    "todos",
    // The engine, in the order a start meets it: the order of a start, then its steps.
    "engine/recovery",
    "engine/rebuild",
    "engine/open",
    "engine/migrate",
    "engine/check",
    "engine/safety_copy",
    "engine/witness",
    "engine/durability",
    "journal",
    "engine/commit",
    // The change list a commit applies, and the plain records it names, each with its
    // subject's reads.
    "change",
    "records",
    "read_marks",
    "lane_models",
    "turns",
    "agent_jobs",
    "approvals",
    "devices",
    "media",
    "sessions",
    // sled's handle and the state it holds.
    "engine/handle",
    "engine/witness_clock",
    "engine/replay_bound",
    // The history database: its writes, the file, its query thread.
    "sql_write",
    "sql",
    "sql_query",
    // Leaves every room may reach.
    "engine/kill_points",
    "keys",
    "fold",
    "base",
];

/// The store room a module is (`["store", "engine", "open"]` → `engine/open`), or `None`
/// outside the store.
fn store_room_of(module: &[String]) -> Option<String> {
    match module {
        [top] if top == "store" => Some("mod".to_owned()),
        [top, rest @ ..] if top == "store" => Some(rest.join("/")),
        _ => None,
    }
}

/// Imports from one store room to a room before it in `rooms` (each naming file and line), and
/// the store's files no room names.
fn judge_store_rooms(src: &Path, rooms: &[&str]) -> (Vec<String>, BTreeSet<String>) {
    let files = read_tree(src);
    let modules: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let room_of = store_room_of;
    let mut backward = Vec::new();
    let mut unplaced = BTreeSet::new();
    for f in &files {
        let Some(room) = room_of(&f.module) else {
            continue;
        };
        let Some(at) = rooms.iter().position(|r| *r == room) else {
            unplaced.insert(room);
            continue;
        };
        for imp in &f.imports {
            let Some(j) = resolve(f, &imp.path, &modules) else {
                continue;
            };
            let Some(target) = room_of(&files[j].module) else {
                continue;
            };
            // A room's own names are its own.
            if target == room {
                continue;
            }
            match rooms.iter().position(|r| *r == target) {
                Some(t) if t < at => backward.push(format!(
                    "{}:{}: room `{room}` imports `{}` from `{target}`, a room before it",
                    f.file.display(),
                    imp.line,
                    imp.path.join("::"),
                )),
                Some(_) => {}
                None => {
                    unplaced.insert(target);
                }
            }
        }
    }
    (backward, unplaced)
}

#[test]
fn the_store_rooms_import_only_rooms_after_their_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (backward, unplaced) = judge_store_rooms(&src, STORE_ROOMS);
    let mut report = String::new();
    if !unplaced.is_empty() {
        report += &format!(
            "store rooms in no place (add them to STORE_ROOMS and docs/architecture.md): {unplaced:?}\n"
        );
    }
    for b in &backward {
        report += &format!("import against the store's order: {b}\n");
    }
    assert!(report.is_empty(), "\n{report}");
}

/// The store's check must see what it is for: a room importing an earlier one fails with its file
/// and line, an import of a face fails as one, a nested room (`engine/x`) is held as the others,
/// later rooms pass, and an unlisted room is named.
#[test]
fn the_store_check_catches_an_import_back_and_an_unplaced_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod store;\n");
    write(
        "store/mod.rs",
        "mod base;\nmod engine;\nmod first;\nmod second;\nmod stray;\npub use base::Store;\n",
    );
    write("store/base.rs", "pub struct Store;\n");
    write("store/engine/mod.rs", "pub(super) mod deep;\n");
    write(
        "store/engine/deep.rs",
        "use crate::store::base::Store;\n\npub fn d() { crate::store::first::f(); }\n",
    );
    write(
        "store/first.rs",
        "use super::base::Store;\nuse super::second::g;\npub fn f() {}\n",
    );
    write(
        "store/second.rs",
        "use super::Store;\n\npub fn g() { super::first::f(); }\n",
    );
    write("store/stray.rs", "pub fn h() {}\n");
    let rooms = ["mod", "engine", "first", "engine/deep", "second", "base"];
    let (backward, unplaced) = judge_store_rooms(src, &rooms);
    assert_eq!(unplaced, BTreeSet::from(["stray".to_owned()]));
    assert_eq!(backward.len(), 3, "{backward:?}");
    assert!(backward[0].contains("deep.rs:3"), "{backward:?}");
    assert!(backward[1].contains("second.rs:1"), "{backward:?}");
    assert!(backward[2].contains("second.rs:3"), "{backward:?}");

    write("store/engine/deep.rs", "use crate::store::base::Store;\n");
    write(
        "store/second.rs",
        "use super::base::Store;\npub fn g() {}\n",
    );
    let rooms = [
        "mod",
        "engine",
        "first",
        "engine/deep",
        "second",
        "stray",
        "base",
    ];
    let (backward, unplaced) = judge_store_rooms(src, &rooms);
    assert!(
        backward.is_empty() && unplaced.is_empty(),
        "{backward:?} {unplaced:?}"
    );
}

/// The store's faces: they declare rooms and re-export, nothing else, so no room needs them.
const STORE_FACES: &[&str] = &["store/mod.rs", "store/engine/mod.rs"];

/// The statements of a file's code (comments, strings and tests left out) other than a module
/// declaration or a re-export.
fn not_declaring_or_re_exporting(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut statement = String::new();
    for c in code.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        statement.push(c);
        if c == ';' && depth == 0 {
            let s = statement.split_whitespace().collect::<Vec<_>>().join(" ");
            let item = s
                .strip_prefix("pub(super) ")
                .or_else(|| s.strip_prefix("pub(crate) "))
                .or_else(|| s.strip_prefix("pub "))
                .unwrap_or(&s);
            let declares = item.starts_with("mod ");
            let re_exports = s.starts_with("pub use ") || s.starts_with("pub(crate) use ");
            if !declares && !re_exports {
                out.push(s);
            }
            statement.clear();
        }
    }
    let rest = statement.split_whitespace().collect::<Vec<_>>().join(" ");
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[test]
fn the_store_faces_only_declare_rooms_and_re_export() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut report = String::new();
    for face in STORE_FACES {
        let text = std::fs::read_to_string(src.join(face)).expect("read a face");
        for s in not_declaring_or_re_exporting(&code_only(&text)) {
            report += &format!("{face} holds more than rooms and re-exports: {s}\n");
        }
    }
    assert!(report.is_empty(), "\n{report}");
    // The check sees what it is for.
    let face = "//! A face.\nmod a;\npub(super) mod b;\npub use a::{X,\n    Y};\n\
                use a::Z;\npub struct S {\n    f: u8,\n}\nfn h() {}\n\
                #[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    assert_eq!(
        not_declaring_or_re_exporting(&code_only(face)),
        ["use a::Z;", "pub struct S { f: u8, } fn h() {}"]
    );
}

/// The hub's state, piece by piece, and the one file that may touch it: the parts with private
/// fields behind a small API (`Lanes`, `Fanout`, …), and the few cells only one file borrows.
/// `state.rs` builds the `Hub`, so it names them all once.
const HUB_STATE_OWNERS: &[(&str, &str)] = &[
    ("lanes", "lanes.rs"),
    ("fanout", "fanout.rs"),
    ("health", "health.rs"),
    ("choices", "choices.rs"),
    ("open", "approvals.rs"),
    ("read_marks", "read_marks.rs"),
    ("unsettled", "unsettled.rs"),
    ("voice_noticed", "voice.rs"),
    ("bad_hellos", "devices.rs"),
    ("query_budgets", "search.rs"),
    ("transcriber", "voice.rs"),
    ("speaker", "voice_reply.rs"),
    ("deferred", "media.rs"),
];

/// The parts and their files: a part's struct declares no field other files could reach (the
/// plain values it hands out, such as a queued turn, may).
const HUB_PARTS: &[(&str, &str)] = &[
    ("lanes.rs", "Lanes"),
    ("fanout.rs", "Fanout"),
    ("health.rs", "Health"),
    ("choices.rs", "Choices"),
    ("approvals.rs", "OpenApprovals"),
    ("agent_calls.rs", "AgentCalls"),
    ("read_marks.rs", "ReadMarks"),
    ("unsettled.rs", "Unsettled"),
    ("directory.rs", "Directory"),
    ("automation.rs", "Automation<P>"),
    ("jobs.rs", "AgentJobs"),
    ("media.rs", "Media<P>"),
    ("search.rs", "Queries"),
    ("push.rs", "Push<P>"),
    ("update.rs", "UpdateWatch<P>"),
    ("storage.rs", "StorageWatch"),
    ("commands.rs", "Commands"),
    ("message_send.rs", "Messages"),
    ("devices.rs", "Devices<P>"),
    ("status.rs", "Status<P>"),
];

/// Where hub code (comments, strings and tests left out) reaches into a piece of state it does
/// not own: `file: .field` for every borrow of a cell outside its owner, and every non-private
/// field of a part's struct.
fn hub_state_trespasses(hub: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    rust_files(hub, &mut files);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let code = without_test_items(&code_only(&std::fs::read_to_string(f).unwrap()));
        for (field, owner) in HUB_STATE_OWNERS {
            // The part's API is called through the field everywhere (`self.lanes.enqueue`);
            // only the cells are borrowed, and only by their owner.
            let borrowed = code.contains(&format!(".{field}.borrow"));
            if borrowed && name != *owner && name != "state.rs" {
                out.push(format!("{name}: .{field}"));
            }
        }
        for (_, part) in HUB_PARTS.iter().filter(|(file, _)| *file == name) {
            let head = format!("struct {part} {{");
            let Some(start) = code.find(&head) else {
                out.push(format!("{name}: no struct {part}"));
                continue;
            };
            let body = &code[start + head.len()..];
            let body = &body[..body.find("\n}").unwrap_or(body.len())];
            for line in body.lines() {
                let t = line.trim_start();
                let rest = ["pub(super) ", "pub(crate) ", "pub "]
                    .iter()
                    .find_map(|v| t.strip_prefix(v));
                let Some(rest) = rest else { continue };
                // `name: Type,` (not a method, whose parameters have parentheses).
                if rest.contains(": ") && !rest.contains('(') && rest.ends_with(',') {
                    let shown = t.trim_end_matches(',');
                    out.push(format!("{name}: a field others can reach: {shown}"));
                }
            }
        }
    }
    out.sort();
    out
}

/// A check over `src/hub` finds nothing there, and finds exactly `expected` in a scratch hub
/// made of `files` (name, text): it sees what it is for.
fn holds_for_the_hub(check: fn(&Path) -> Vec<String>, files: &[(&str, &str)], expected: &[&str]) {
    let hub = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/hub");
    let found = check(&hub);
    assert!(found.is_empty(), "{found:#?}");
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    assert_eq!(check(dir.path()), expected);
}

/// One owner per piece of the hub's state: no file touches another's (docs/architecture.md).
#[test]
fn each_piece_of_hub_state_has_one_owner() {
    holds_for_the_hub(
        hub_state_trespasses,
        &[
            (
                "turn_run.rs",
                "fn f(h: &Hub) { h.voice_noticed.borrow_mut().clear(); }\n",
            ),
            (
                "lanes.rs",
                "pub(super) struct Lanes {\n    pub(super) lanes: Vec<u8>,\n}\n\
                 pub(super) struct QueuedTurn {\n    pub text: String,\n}\n",
            ),
        ],
        &[
            "lanes.rs: a field others can reach: pub(super) lanes: Vec<u8>",
            "turn_run.rs: .voice_noticed",
        ],
    );
}

/// The owners a service port must not hand out: asking the hub a question is narrow, holding
/// another owner's handle is not (docs/architecture.md, the services' ports).
fn hub_owners() -> Vec<String> {
    let mut owners: Vec<String> = HUB_PARTS
        .iter()
        .map(|(_, part)| part.trim_end_matches("<P>").to_owned())
        .collect();
    owners.extend(["Hub", "Fanout", "Health", "Config", "Turns"].map(String::from));
    owners
}

/// Where a service's port (`trait Port`, or a `trait …Port` built on it) returns a reference to
/// one of the hub's owners: `file: fn name -> type`. The turns' own port (`TurnPort`) stands
/// apart: it is not built on `Port`.
fn ports_handing_out_owners(hub: &Path) -> Vec<String> {
    let owners = hub_owners();
    let mut out = Vec::new();
    let mut files = Vec::new();
    rust_files(hub, &mut files);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let code = without_test_items(&code_only(&std::fs::read_to_string(f).unwrap()));
        let mut rest = code.as_str();
        while let Some(at) = rest.find("trait ") {
            let after = &rest[at + "trait ".len()..];
            let header = &after[..after.find('{').unwrap_or(after.len())];
            let trait_name: String = header.chars().take_while(|c| is_ident(*c)).collect();
            let on_port = trait_name == "Port"
                || header.contains(": Port")
                || header
                    .split(':')
                    .nth(1)
                    .is_some_and(|s| s.trim().ends_with("Port"));
            let body_start = after.find('{').map_or(after.len(), |i| i + 1);
            let body = &after[body_start..];
            let body = &body[..body.find("\n}").unwrap_or(body.len())];
            if trait_name.ends_with("Port") && on_port {
                for sig in body.split(';') {
                    let Some(arrow) = sig.find("-> &") else {
                        continue;
                    };
                    let ty = sig[arrow + "-> &".len()..]
                        .trim_start_matches("mut ")
                        .trim();
                    let ty: String = ty
                        .trim_start_matches("Rc<")
                        .chars()
                        .take_while(|c| is_ident(*c))
                        .collect();
                    if owners.contains(&ty) {
                        let fn_name = sig
                            .split("fn ")
                            .nth(1)
                            .map(|s| s.chars().take_while(|c| is_ident(*c)).collect::<String>())
                            .unwrap_or_default();
                        out.push(format!("{name}: {trait_name}::{fn_name} -> &{ty}"));
                    }
                }
            }
            rest = &after[body_start..];
        }
    }
    out.sort();
    out
}

/// The services' ports ask questions; none hands a service another owner of the hub. The
/// scratch hub also shows the check leaves the turns' own port and plain answers alone.
#[test]
fn no_service_port_hands_out_another_owner() {
    holds_for_the_hub(
        ports_handing_out_owners,
        &[
            (
                "port.rs",
                "pub trait Port {\n    fn fanout(&self) -> &Fanout;\n    \
                 fn published_head(&self) -> u64;\n}\n",
            ),
            (
                "devices.rs",
                "pub trait DevicesPort: PushPort {\n    fn config(&self) -> &Config;\n    \
                 fn backend(&self) -> &'static str;\n}\n",
            ),
            (
                "turn_port.rs",
                "pub trait TurnPort: 'static {\n    fn config(&self) -> &Config;\n}\n",
            ),
        ],
        &[
            "devices.rs: DevicesPort::config -> &Config",
            "port.rs: Port::fanout -> &Fanout",
        ],
    );
}
