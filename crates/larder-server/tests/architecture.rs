//! The server's layers (docs/ARCHITECTURE.md, "The server") hold: every module uses only
//! modules of layers below its own, so no door imports another door and nothing shared reaches
//! up into a door; inside each folder (a door, the policy, the CLI…) the same holds between its
//! files; and no source file grows past the size a reader takes in at once. Read from the
//! source: each `crate::…` path in a file of `src/` names the module it reaches into, and the
//! file's own module is the first component of its path; inside a folder, `super::…` paths
//! (and a `mod.rs`'s paths into its own children) are read the same way.

use std::path::Path;

/// Bottom to top. A module may use the modules of the layers before its own, never one of its
/// own layer (other than itself) or above.
const LAYERS: &[&[&str]] = &[
    &["headers", "key", "cluster", "h1", "lanes"],
    &["config"],
    &["guard", "metrics", "reply", "watch"],
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

/// Inside each folder of `src/`, its modules bottom to top, as [`LAYERS`] orders the top
/// level (`mod` is the folder's own `mod.rs`). No folder is left out: a new one must say its
/// order here.
const INNER: &[(&str, &[&[&str]])] = &[
    (
        "memcache",
        &[
            // Pure encodings: bytes to a request, an answer to bytes.
            &["wire"],
            &["counters"],
            &["logs"],
            // What the connections share, then one connection's transport.
            &["listener"],
            &["conn"],
            // The policy's side, then item semantics written once.
            &["access"],
            &["item"],
            &["meta"],
            &["operator"],
            // The command table, the connection's loop, the listener's face.
            &["exec"],
            &["session"],
            &["mod"],
        ],
    ),
    ("memcache/wire", &[&["number", "request"], &["binary", "meta", "text"], &["mod"]]),
    (
        "proxy",
        &[
            // RFC 9111 as pure functions, the flights' table, the origin's connection.
            &["directives", "flight", "origin"],
            &["policy"],
            &["stored"],
            // Finding a stored response; the mode's state.
            &["lookup", "mode"],
            &["serve", "pass"],
            &["invalidate"],
            &["lead"],
            &["fetch"],
            &["mod"],
        ],
    ),
    ("dav", &[&["xml"], &["mod"]]),
    // What a connection's timeouts read, and answers on their way out; hyper's connection;
    // the server's own loop on the runtime, which hands a connection to hyper; the event
    // loops, which hand one to the runtime's; the registry.
    ("conn", &[&["activity", "out"], &["via_hyper"], &["native"], &["reactor"], &["mod"]]),
    ("guard", &[&["budget", "ring"], &["mod"]]),
    ("watch", &[&["hot", "latency", "slow"], &["mod"]]),
    // The stats as JSON, the page's files; the window's endpoints and sampler over the stats.
    ("admin", &[&["stats", "page"], &["window"], &["mod"]]),
    ("config", &[&["compression", "token"], &["mod"]]),
    ("cli", &[&["client"], &["bench", "check", "fleet", "keys", "stats", "top"], &["mod"]]),
];

/// The longest a source file may be, in lines.
const MAX_LINES: usize = 700;

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

/// The module path of a source file (`memcache/wire/text.rs`: `memcache::wire::text`;
/// a `mod.rs` is its folder's module).
fn module_path(rel: &str) -> Vec<String> {
    let mut p: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
    if p.last().is_some_and(|l| l == "mod") {
        p.pop();
    }
    p
}

/// The modules a file's text reaches into, as absolute paths of up to three names: `crate::`
/// paths, `super::` paths resolved from the file's own module, and, in a `mod.rs`, paths into
/// the children it declares. Comment lines (a doc's link names, not an import) and test
/// modules (from `#[cfg(test)]` on) are not read.
fn paths_used(rel: &str, text: &str) -> Vec<Vec<String>> {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let text = code.as_str();
    let own = module_path(rel);
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    // After a path's prefix: one name, or a group `{a, b::c}` of them (one level).
    let names_after = |after: &str| -> Vec<Vec<String>> {
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|n| n.trim().split("::").map(|x| ident(x.trim())).filter(|x| !x.is_empty()).collect())
                .filter(|n: &Vec<String>| !n.is_empty() && n[0] != "self")
                .collect()
        } else {
            let path: Vec<String> =
                after.split("::").take(3).map(ident).take_while(|x| !x.is_empty()).collect::<Vec<_>>();
            if path.is_empty() {
                vec![]
            } else {
                vec![path]
            }
        }
    };
    let mut used = Vec::new();
    let is_start = |text: &str, at: usize| {
        text[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'))
    };
    for (at, _) in text.match_indices("crate::") {
        if is_start(text, at) {
            used.extend(names_after(&text[at + 7..]));
        }
    }
    for (at, _) in text.match_indices("super::") {
        if !is_start(text, at) {
            continue;
        }
        let mut rest = &text[at..];
        let mut base = own.clone();
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for n in names_after(rest) {
            used.push(base.iter().cloned().chain(n).collect());
        }
    }
    if rel.ends_with("mod.rs") {
        let children: Vec<String> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod ").or(l.trim().strip_prefix("mod ")))
            .filter_map(|l| l.strip_suffix(';'))
            .map(String::from)
            .collect();
        for child in &children {
            let prefix = format!("{child}::");
            for (at, _) in text.match_indices(&prefix) {
                if is_start(text, at) {
                    for n in names_after(&text[at + prefix.len()..]) {
                        used.push(own.iter().cloned().chain([child.clone()]).chain(n).collect());
                    }
                }
            }
        }
    }
    used
}

/// What a file inside a folder of [`INNER`] uses that is not below it in that folder.
fn inner_wrongs(rel: &str, text: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    let parts: Vec<&str> = rel.split('/').collect();
    for depth in 1..parts.len() {
        let folder = parts[..depth].join("/");
        let own = parts[depth].trim_end_matches(".rs");
        let Some((_, layers)) = INNER.iter().find(|(f, _)| *f == folder) else {
            wrong.push(format!("{rel}: folder `{folder}` has no inner layers in this test"));
            continue;
        };
        let layer = |m: &str| layers.iter().position(|l| l.contains(&m));
        let Some(mine) = layer(own) else {
            wrong.push(format!("{rel}: `{own}` is in no layer of `{folder}`"));
            continue;
        };
        let prefix: Vec<&str> = folder.split('/').collect();
        for path in paths_used(rel, text) {
            if path.len() <= prefix.len() || path[..prefix.len()] != prefix[..] {
                continue;
            }
            let used = &path[prefix.len()];
            if used == own {
                continue;
            }
            match layer(used) {
                Some(l) if l < mine => {}
                Some(_) => wrong.push(format!("{rel}: `{folder}/{own}` uses `{used}`, which is not below it")),
                None => {
                    wrong.push(format!("{rel}: `{folder}/{own}` uses `{used}`, which is in no layer of `{folder}`"))
                }
            }
        }
    }
    wrong
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
        // A folder's own test file (`config/tests.rs`) is its mod.rs's test module.
        if !rel.ends_with("/tests.rs") {
            wrong.extend(inner_wrongs(rel, text));
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

#[test]
fn the_checker_sees_a_file_inside_a_door_reaching_up_or_sideways() {
    // Down is fine; up, sideways, or into the folder's face is not.
    assert!(
        inner_wrongs("memcache/exec.rs", "use super::item::{self, Put};\nuse super::wire::{text, Reply};").is_empty()
    );
    assert_eq!(inner_wrongs("memcache/item.rs", "use super::exec::run;").len(), 1);
    assert_eq!(inner_wrongs("memcache/meta.rs", "use super::{item, operator};").len(), 1, "sideways or up");
    assert_eq!(inner_wrongs("memcache/conn.rs", "let n = super::Conn::new();").len(), 1, "the face");
    assert_eq!(inner_wrongs("proxy/lead.rs", "use crate::proxy::fetch::Plan;").len(), 1);
    // Nested folders: `super::` from a file of memcache/wire/ stays in wire; two go up a level.
    assert!(inner_wrongs("memcache/wire/text.rs", "use super::request::Request;").is_empty());
    assert_eq!(inner_wrongs("memcache/wire/request.rs", "use super::text::parse;").len(), 1);
    assert_eq!(inner_wrongs("memcache/wire/text.rs", "use super::super::conn::Conn;").len(), 1);
    // A mod.rs reaching into its children is reaching down; a child's path in a bottom mod.rs
    // is reaching up.
    assert!(inner_wrongs("memcache/mod.rs", "mod session;\nlet _ = session::run(c);").is_empty());
    assert_eq!(inner_wrongs("memcache/nowhere.rs", "").len(), 1, "every file is in a layer");
    assert_eq!(inner_wrongs("newdoor/x.rs", "").len(), 1, "every folder says its order");
    // Test modules and comments are not read.
    assert!(inner_wrongs("proxy/origin.rs", "/// See [`super::lead::Plan`].").is_empty());
    assert!(inner_wrongs("memcache/item.rs", "#[cfg(test)]\nmod tests { use super::super::exec; }").is_empty());
}
