//! The server's layers (docs/ARCHITECTURE.md, "The server") hold: every module uses only
//! modules of layers below its own, so no door imports another door and nothing shared reaches
//! up into a door; and no source file grows past the size a reader takes in at once. Read from
//! the source: each `crate::…` path in a file of `src/` names the module it reaches into, and
//! the file's own module is the first component of its path.

use std::path::Path;

/// Bottom to top. A module may use the modules of the layers before its own, never one of its
/// own layer (other than itself) or above.
const LAYERS: &[&[&str]] = &[
    &["headers", "key", "cluster"],
    &["config"],
    &["guard", "metrics", "reply"],
    &["app"],
    &["storeio", "body"],
    // The doors: each maps its protocol onto the policy and the store, and knows no other.
    &["api", "dav", "proxy", "memcache"],
    // The operator's view over every door (stats, metrics, purge).
    &["admin"],
    // The HTTP listener: dispatch to the key API, the proxy or admin; connections.
    &["routes"],
    &["conn"],
    &["lifecycle"],
    &["cli", "main"],
];

/// The longest a source file may be, in lines.
const MAX_LINES: usize = 720;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every module a source text reaches into with a `crate::` path (`use crate::x::…`,
/// `use crate::{x, y}`, or a path inline).
fn modules_used(text: &str) -> Vec<String> {
    let mut used = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').map(|n| n.split("::").next().unwrap_or("").trim()).collect()
        } else {
            let end = after.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(after.len());
            vec![&after[..end]]
        };
        used.extend(names.into_iter().filter(|n| !n.is_empty() && *n != "self").map(String::from));
        rest = after;
    }
    used
}

/// Each `.rs` file under `src` with the top module it belongs to, its text and its path.
fn sources(src: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().to_string_lossy().to_string();
            let module = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            out.push((module, std::fs::read_to_string(&path).unwrap(), rel));
        }
    }
    out
}

#[test]
fn no_module_reaches_up_or_sideways_and_no_file_is_too_long() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let files = sources(&src);
    assert!(files.len() > 20, "the sources were found");
    for (module, text, rel) in &files {
        let Some(own) = layer_of(module) else {
            wrong.push(format!("{rel}: module `{module}` is in no layer of this test"));
            continue;
        };
        for used in modules_used(text) {
            if &used == module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(_) => wrong.push(format!("{rel}: `{module}` uses `{used}`, which is not below it")),
                None => wrong.push(format!("{rel}: `{module}` uses `{used}`, which is in no layer")),
            }
        }
        let lines = text.lines().count();
        if lines > MAX_LINES {
            wrong.push(format!("{rel}: {lines} lines (at most {MAX_LINES})"));
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_a_door_importing_another_and_shared_state_reaching_up() {
    // The same reading as above, on texts that break the rules.
    assert_eq!(modules_used("use crate::api::{blocking, Read};"), ["api"]);
    assert_eq!(
        modules_used("use crate::{app::App, proxy};\nlet x = crate::memcache::counters();"),
        ["app", "proxy", "memcache"]
    );
    let (proxy, api, app) = (layer_of("proxy"), layer_of("api"), layer_of("app"));
    assert_eq!(proxy, api, "doors share a layer, so one using another fails");
    assert!(app < proxy, "shared state is below the doors, so reaching up fails");
}
