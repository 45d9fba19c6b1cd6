//! The engine's layers (docs/ARCHITECTURE.md) hold: every module uses only modules of layers
//! below its own. Read from the source: each `crate::…` path in a file of `src/` names the
//! module it reaches into, and the file's own module is the first component of its path.

use std::collections::HashMap;
use std::path::Path;

/// Bottom to top. A module may use the modules of the layers before its own, never one of
/// its own layer (other than itself) or above.
const LAYERS: &[&[&str]] = &[
    &["error", "pause", "trace"],
    &["types"],
    &["config", "clock", "stats"],
    &["format"],
    &["io", "twins"],
    &["index"],
    &["disk"],
    &["recovery"],
    &["memory"],
    &["maintenance"],
    &["store"],
    &["check"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The names the crate root re-exports (`pub use module::{A, B}`), by the module they come from.
fn root_exports(lib: &str) -> HashMap<String, String> {
    let mut names = HashMap::new();
    let flat = lib.replace('\n', " ");
    for stmt in flat.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else { continue };
        let rest = rest.trim();
        let module = rest.split("::").next().unwrap_or("").to_string();
        let tail = &rest[module.len()..].trim_start_matches("::");
        let list = tail.trim_start_matches('{').trim_end_matches('}');
        for name in list.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.clone());
            }
        }
    }
    names
}

/// Every module a source text reaches into with a `crate::` path (`use crate::x::…`,
/// `use crate::{x, Y}`, or a path inline), root re-exports resolved to their module.
fn modules_used(text: &str, exports: &HashMap<String, String>) -> Vec<String> {
    let mut used = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        // A brace group lists several names; otherwise one path component follows.
        let names: Vec<&str> = if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').map(|n| n.split("::").next().unwrap_or("").trim()).collect()
        } else {
            let end = after.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(after.len());
            vec![&after[..end]]
        };
        for name in names.into_iter().filter(|n| !n.is_empty() && *n != "self") {
            let module = if name.starts_with(|c: char| c.is_ascii_uppercase()) || layer_of(name).is_none() {
                exports.get(name).cloned().unwrap_or_else(|| format!("?{name}"))
            } else {
                name.to_string()
            };
            used.push(module);
        }
        rest = after;
    }
    used
}

/// Each `.rs` file under `dir` with the top module it belongs to.
fn sources(src: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap().to_string_lossy().into_owned();
                let module = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
                out.push((module, rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out
}

/// The upward or sideways uses in `files`, as "file: module uses other".
fn violations(files: &[(String, String, String)], exports: &HashMap<String, String>) -> (Vec<String>, usize) {
    let (mut bad, mut checked) = (Vec::new(), 0);
    for (module, rel, text) in files {
        if module == "lib" {
            continue; // the root declares and re-exports every layer
        }
        let own = layer_of(module).unwrap_or_else(|| panic!("{rel}: module `{module}` is in no layer of LAYERS"));
        for used in modules_used(text, exports) {
            checked += 1;
            if used == *module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                _ => bad.push(format!("{rel}: `{module}` (layer {own}) uses `{used}` ({:?})", layer_of(&used))),
            }
        }
    }
    (bad, checked)
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exports = root_exports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(exports.get("Store").is_some_and(|m| m == "store"), "root exports not read: {exports:?}");
    let files = sources(&src);
    let (bad, checked) = violations(&files, &exports);
    assert!(checked > 100, "only {checked} crate paths found: the scan is not reading the source");
    assert!(bad.is_empty(), "modules reaching up or sideways:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_an_upward_use_and_a_sideways_one() {
    let exports = root_exports("pub use store::Store;\npub use error::{Error, Result};");
    let file = |module: &str, text: &str| (module.to_string(), format!("{module}.rs"), text.to_string());
    let files = [
        file("disk", "use crate::store::Store;\nuse crate::{index, Error};"),
        file("format", "fn f() -> crate::Store { todo!() }"),
        file("clock", "use crate::config::StoreConfig;"),
        file("recovery", "use crate::{disk::Ring, format, io, Result};"),
    ];
    let (bad, _) = violations(&files, &exports);
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(bad[0].starts_with("disk.rs: `disk` (layer 6) uses `store`"), "{bad:#?}");
    assert!(bad[1].starts_with("format.rs: `format` (layer 3) uses `store`"), "{bad:#?}");
    assert!(bad[2].starts_with("clock.rs: `clock` (layer 2) uses `config`"), "{bad:#?}");
}
