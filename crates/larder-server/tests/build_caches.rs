//! Build caches pointed at larder, unchanged, as their users run them (installed by
//! scripts/install-bench-deps.sh and scripts/install-python-deps.sh; a missing tool fails the
//! test): sccache over WebDAV and over memcached's protocol, rclone as a WebDAV remote, and Bazel's HTTP remote cache with
//! `--verify-cas`.

mod common;

use common::Server;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end within `limit` (killed past it, failing the test), its output kept.
fn run(mut cmd: Command, limit: Duration) -> Output {
    let out = tempfile::tempdir().unwrap();
    let (o, e) = (out.path().join("out"), out.path().join("err"));
    cmd.stdout(std::fs::File::create(&o).unwrap()).stderr(std::fs::File::create(&e).unwrap());
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {e} (the install scripts install it)"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what} ran past {limit:?}:\n{}", std::fs::read_to_string(&e).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: std::fs::read(o).unwrap(), stderr: std::fs::read(e).unwrap() }
}

/// Runs `cmd`, which must succeed; its standard output, then its standard error.
fn ok(cmd: Command, limit: Duration) -> (String, String) {
    let what = format!("{cmd:?}");
    let out = run(cmd, limit);
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{what} failed:\n{o}{e}");
    (o, e)
}

/// A small C project: sources that compile to objects independently.
fn c_project(dir: &Path, files: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("lib.h"), "int scale(int x, int by);\n").unwrap();
    for i in 0..files {
        let src = format!("#include \"lib.h\"\nint f{i}(int x) {{ return scale(x, {i}) + {}; }}\n", i * 7);
        std::fs::write(dir.join(format!("f{i}.c")), src).unwrap();
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// sccache's server, stopped when dropped (also when the test fails).
struct Sccache {
    bin: PathBuf,
    envs: Vec<(String, String)>,
}

impl Sccache {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.envs(self.envs.iter().map(|(k, v)| (k, v)));
        c
    }

    fn start(&self) {
        let mut c = self.cmd();
        c.arg("--start-server");
        ok(c, MINUTE);
    }

    /// One compile through sccache.
    fn cc(&self, dir: &Path, file: &str) {
        let mut c = self.cmd();
        c.args(["gcc", "-O2", "-c", file, "-o"]).arg(file.replace(".c", ".o")).current_dir(dir);
        ok(c, MINUTE);
    }

    /// The counter `name` of `--show-stats` (its text form: the name, then the count).
    fn stat(&self, name: &str) -> u64 {
        let mut c = self.cmd();
        c.arg("--show-stats");
        let text = ok(c, MINUTE).0;
        let line = text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with("  "));
        let line = line.unwrap_or_else(|| panic!("no {name:?} in:\n{text}"));
        line.split_whitespace().last().unwrap().parse().unwrap()
    }

    fn stop(&self) {
        let mut c = self.cmd();
        c.arg("--stop-server");
        let _ = run(c, MINUTE);
    }
}

impl Drop for Sccache {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn sccache_over_webdav_second_build_is_all_remote_hits() {
    sccache_second_build_is_all_remote_hits(false);
}

#[test]
fn sccache_over_memcached_second_build_is_all_remote_hits() {
    sccache_second_build_is_all_remote_hits(true);
}

/// Two builds of a C project through sccache with larder as its only cache (over WebDAV, or
/// over memcached's protocol): the first stores every object, the second is served them all.
fn sccache_second_build_is_all_remote_hits(memcached: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/python/bin/sccache");
    assert!(root.exists(), "{} missing: scripts/install-python-deps.sh installs sccache", root.display());
    let s = Server::start(&["--memcache-listen", "127.0.0.1:0"]);
    let tmp = tempfile::tempdir().unwrap();
    let port = common::free_ports(0).to_string();
    let backend = match memcached {
        false => ("SCCACHE_WEBDAV_ENDPOINT".into(), format!("http://{}/sccache", s.addr)),
        true => ("SCCACHE_MEMCACHED_ENDPOINT".into(), format!("tcp://{}", s.memcache.unwrap())),
    };
    let sc = Sccache {
        bin: root,
        envs: vec![
            backend,
            ("SCCACHE_SERVER_PORT".into(), port),
            ("SCCACHE_DIR".into(), tmp.path().join("local").to_str().unwrap().into()),
            ("SCCACHE_CONF".into(), tmp.path().join("no-config").to_str().unwrap().into()),
            ("SCCACHE_ERROR_LOG".into(), tmp.path().join("sccache.log").to_str().unwrap().into()),
            ("SCCACHE_LOG".into(), "warn".into()),
        ],
    };
    let files = 12;
    let src = tmp.path().join("src");
    c_project(&src, files);
    let build = |round: &str| -> Vec<Vec<u8>> {
        sc.start();
        for i in 0..files {
            sc.cc(&src, &format!("f{i}.c"));
        }
        let objects = (0..files).map(|i| std::fs::read(src.join(format!("f{i}.o"))).unwrap()).collect();
        let (hits, misses, write_errors, read_errors) = (
            sc.stat("Cache hits"),
            sc.stat("Cache misses"),
            sc.stat("Cache write errors"),
            sc.stat("Cache read errors"),
        );
        eprintln!("{round}: {hits} hits, {misses} misses, {write_errors} write errors, {read_errors} read errors");
        assert_eq!((write_errors, read_errors), (0, 0), "{round}");
        if round == "first" {
            assert_eq!((hits, misses), (0, files as u64), "{round}");
        } else {
            assert_eq!((hits, misses), (files as u64, 0), "{round}: every compile a remote hit");
        }
        sc.stop();
        for i in 0..files {
            std::fs::remove_file(src.join(format!("f{i}.o"))).unwrap();
        }
        objects
    };
    let first = build("first");
    // sccache's own check object and one entry per compile, all stored in larder.
    assert_eq!(s.stats()["keys"], files as u64 + 1);
    let second = build("second");
    assert_eq!(first, second, "the objects served are the objects compiled");
}

#[test]
fn rclone_uses_larder_as_a_webdav_remote() {
    let s = Server::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("rclone.conf"), "").unwrap(); // the remote is in the environment
    let rclone = |args: &[&str]| -> Command {
        let mut c = Command::new("rclone");
        c.args(args)
            .env("RCLONE_CONFIG", tmp.path().join("rclone.conf"))
            .env("RCLONE_CONFIG_LARDER_TYPE", "webdav")
            .env("RCLONE_CONFIG_LARDER_URL", format!("http://{}/files", s.addr))
            .env("RCLONE_CONFIG_LARDER_VENDOR", "other");
        c
    };
    let big = common::bytes(3, 3 << 20); // streamed on the server: longer than a chunk
    let small = b"a note\n".to_vec();
    std::fs::write(tmp.path().join("big.bin"), &big).unwrap();
    std::fs::write(tmp.path().join("note.txt"), &small).unwrap();
    for (file, to) in [("big.bin", "larder:dir/big.bin"), ("note.txt", "larder:dir/sub/a note.txt")] {
        ok(rclone(&["copyto", tmp.path().join(file).to_str().unwrap(), to]), MINUTE);
    }
    let out = run(rclone(&["cat", "larder:dir/big.bin"]), MINUTE);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout == big, "rclone cat gives back the bytes copied in");
    assert_eq!(ok(rclone(&["cat", "larder:dir/sub/a note.txt"]), MINUTE).0, "a note\n");
    assert_eq!(ok(rclone(&["lsf", "larder:dir/big.bin"]), MINUTE).0, "big.bin\n");
    let lsl = ok(rclone(&["lsl", "larder:dir/sub/a note.txt"]), MINUTE).0;
    assert!(lsl.trim_start().starts_with("7 ") && lsl.trim_end().ends_with(" a note.txt"), "{lsl}");
    // A listing of the collection, whole (the store holds few keys).
    assert_eq!(ok(rclone(&["lsf", "larder:dir"]), MINUTE).0, "big.bin\nsub/\n");
    ok(rclone(&["deletefile", "larder:dir/big.bin"]), MINUTE);
    let mut c = s.client();
    assert_eq!(c.get("/files/dir/big.bin").status, 404);
    assert_eq!(c.get("/files/dir/sub/a%20note.txt").body, small);
    assert_eq!(ok(rclone(&["lsf", "larder:dir"]), MINUTE).0, "sub/\n");
}

/// Debian's Bazel has no network here to fetch `rules_cc` and `rules_java`, which its own
/// tools load only to reach the native rules: these stand-ins give it those.
fn rules_stand_ins(dir: &Path) -> Vec<String> {
    let mut flags = Vec::new();
    for (repo, file, rules) in [
        ("rules_cc", "cc", &["cc_binary", "cc_library", "cc_toolchain", "cc_toolchain_suite"][..]),
        ("rules_java", "java", &["java_binary", "java_import", "java_library", "java_runtime", "java_toolchain"]),
    ] {
        let root = dir.join(repo);
        std::fs::create_dir_all(root.join(file)).unwrap();
        std::fs::write(root.join("WORKSPACE"), "").unwrap();
        std::fs::write(root.join(file).join("BUILD"), "").unwrap();
        let defs: String = rules.iter().map(|r| format!("def {r}(**kw):\n    native.{r}(**kw)\n\n")).collect();
        std::fs::write(root.join(file).join("defs.bzl"), defs).unwrap();
        flags.push(format!("--override_repository={repo}={}", root.display()));
    }
    flags
}

#[test]
fn bazel_second_build_is_served_from_larder_and_tampered_cas_uploads_are_refused() {
    let s = Server::start(&["--verify-cas"]);
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    c_project(&ws, 4);
    std::fs::write(ws.join("WORKSPACE"), "").unwrap();
    std::fs::write(ws.join("main.c"), "int scale(int x, int by) { return x * by; }\nint main(void) { return 0; }\n")
        .unwrap();
    let srcs = "[\"main.c\", \"lib.h\", \"f0.c\", \"f1.c\", \"f2.c\", \"f3.c\"]";
    std::fs::write(ws.join("BUILD"), format!("cc_binary(name = \"app\", srcs = {srcs})\n")).unwrap();
    let stand_ins = rules_stand_ins(tmp.path());
    let user_root = tmp.path().join("user-root");
    let build = |base: &str| -> String {
        let mut c = Command::new("bazel");
        c.arg("--bazelrc=/dev/null")
            .arg(format!("--output_user_root={}", user_root.display()))
            .arg(format!("--output_base={}", tmp.path().join(base).display()))
            .arg("--batch")
            .args(["build", "//:app", "--noshow_progress"])
            .arg(format!("--remote_cache=http://{}/bazel", s.addr))
            .args(&stand_ins)
            .current_dir(&ws);
        let text = ok(c, 5 * MINUTE).1; // Bazel reports on standard error
        let summary = text.lines().find(|l| l.contains(" processes: ")).expect("Bazel's summary line").to_string();
        eprintln!("{base}: {summary}");
        summary
    };
    // Each build in an output base of its own: nothing of the first is on disk for the second.
    let first = build("base-1");
    assert!(first.contains("linux-sandbox") || first.contains("local"), "the first build compiles: {first}");
    let second = build("base-2");
    let remote = |summary: &str| -> u64 {
        let at = summary.find(" remote cache hit").unwrap_or_else(|| panic!("no remote cache hits: {summary}"));
        summary[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(remote(&second) >= 5, "five compiles and a link: {second}");
    for executed in ["linux-sandbox", "local", "processwrapper-sandbox"] {
        assert!(!second.contains(executed), "nothing runs in the second build: {second}");
    }

    // Bazel's blobs are under /bazel/cas/<sha256>: overwriting one with other bytes, or
    // uploading bytes under a digest they do not have, is refused and never served.
    let mut c = s.client();
    let listing = c.request("PROPFIND", "/bazel/cas/", &[("Depth", "1")], b"");
    assert_eq!(listing.status, 207);
    let listing = String::from_utf8(listing.body).unwrap();
    let blobs: Vec<&str> = listing.split("<D:href>").skip(2).map(|h| h.split("</D:href>").next().unwrap()).collect();
    assert!(blobs.len() >= 6, "{listing}");
    for blob in &blobs {
        let before = c.get(blob).body;
        let r = c.put(blob, b"int main(void) { return 1; }");
        assert_eq!(r.status, 400, "{blob}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(c.get(blob).body, before, "{blob} keeps its bytes");
    }
    let unknown = format!("/bazel/cas/{}", "ab".repeat(32));
    assert_eq!(c.put(&unknown, b"anything").status, 400);
    assert_eq!(c.get(&unknown).status, 404);
    assert_eq!(s.stats()["cas_refused"], blobs.len() as u64 + 1);
    // And the cache still serves every action.
    let third = build("base-3");
    assert_eq!(remote(&third), remote(&second), "{third}");
}
