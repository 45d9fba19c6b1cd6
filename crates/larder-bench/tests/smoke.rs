//! Smoke tests: each mode of larder-bench runs for a moment and reports. They assert that the
//! instrument works end to end (and fails loudly when nginx is missing), not any speed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_larder-bench"))
}

/// The `larder` binary built alongside (cargo builds every binary of the workspace first).
fn larder_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_larder-bench")).with_file_name("larder");
    assert!(p.exists(), "{p:?} missing: build the workspace (cargo test --workspace does)");
    p
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run larder-bench");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "larder-bench failed:\n{text}");
    text
}

#[test]
fn http_mode_loads_a_server_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let port = 18_301;
    let server = Command::new(larder_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Killed(server);
    // The port accepts before the store is open (requests meanwhile get 503 "recovering");
    // the first line on stdout says it is ready.
    let stdout = server.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {} // keep draining so the server never blocks on stdout
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("larder did not report readiness");
    assert!(line.starts_with("larder listening on "), "unexpected first line {line:?}");
    let url = format!("http://127.0.0.1:{port}/s");
    let put = run_ok(bench().args(["http", &url, "--workload", "put", "--distribution", "sequential"]).args([
        "--keys",
        "2000",
        "--requests",
        "2000",
        "--value-size",
        "1KiB..8KiB",
        "--connections",
        "8",
    ]));
    assert!(put.contains("2000 requests") && put.contains("errors 0"), "{put}");
    let json = dir.path().join("get.json");
    let get = run_ok(
        bench()
            .args(["http", &url, "--keys", "2000", "--value-size", "1KiB..8KiB", "--check-length"])
            .args(["--duration", "2s", "--distribution", "zipf:0.99", "--json"])
            .arg(&json),
    );
    assert!(get.contains("req/s") && get.contains("p99.9"), "{get}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(v["requests"].as_u64().unwrap() > 100 && v["errors"] == 0, "{v}");
    // Keys that were never written are 404s: the run must fail, not report success.
    let out = bench().args(["http", &url, "--keys", "2000", "--start", "50000", "--duration", "1s"]).output().unwrap();
    assert!(!out.status.success(), "a run of 404s passed");
}

#[test]
fn engine_mode_compares_with_foyer() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        bench()
            .args(["engine", "--compare", "foyer", "--bytes", "16MiB", "--duration", "1s", "--sizes", "4KiB,64KiB"])
            .arg("--dir")
            .arg(dir.path()),
    );
    for row in ["| larder | 4 KiB |", "| foyer | 4 KiB |", "| larder | 64 KiB |", "| foyer | 64 KiB |"] {
        assert!(out.contains(row), "{row} missing in:\n{out}");
    }
}

#[test]
fn compare_runs_the_whole_suite_against_larder_and_nginx() {
    let dir = tempfile::tempdir().unwrap();
    let out_base = dir.path().join("result");
    let root = repo_root();
    run_ok(
        bench()
            .args(["compare", "--duration", "500ms", "--rounds", "2", "--scale", "0.02"])
            .arg("--larder")
            .arg(larder_bin())
            .arg("--nginx-conf")
            .arg(root.join("bench/nginx.conf.in"))
            .arg("--out")
            .arg(&out_base),
    );
    let md = std::fs::read_to_string(out_base.with_extension("md")).unwrap();
    for w in ["P4K", "G4K", "G4K-zipf", "P64K", "G64K", "P1M", "G1M", "MIX4K"] {
        assert!(md.contains(&format!("| {w} |")), "{w} missing:\n{md}");
    }
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_base.with_extension("json")).unwrap()).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 8 * 2 * 2);
}

#[test]
fn memory_mode_compares_the_cache_crates() {
    let out = run_ok(bench().args(["memory", "--keys", "2000", "--requests", "20000", "--duration", "200ms"]));
    for name in ["foyer sieve", "quick_cache", "moka tinylfu"] {
        assert!(out.contains(name), "{name} missing from:\n{out}");
    }
    // A zipf(0.99) stream over a cache a tenth of the key space hits well above a tenth.
    let line = out.lines().find(|l| l.starts_with("| quick_cache")).expect("quick_cache row");
    let ratio: f64 = line.split('|').nth(2).unwrap().trim().parse().unwrap();
    assert!(ratio > 0.3 && ratio < 1.0, "{line}");
}

#[test]
fn hitratio_mode_reports_every_policy_and_fifo() {
    // As the benchmark itself does: a memory file system, where hint files' fsyncs do not hold
    // up the background thread that also reinserts.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let out = run_ok(
        bench()
            .args(["hitratio", "--keys", "3000", "--warmup", "30000", "--requests", "20000", "--json"])
            .args(["--dir".as_ref(), dir.path().as_os_str()]),
    );
    let start = out.find('[').expect("JSON array");
    let rows: serde_json::Value = serde_json::from_str(&out[start..out.rfind(']').unwrap() + 1]).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 7, "six memory policies and plain FIFO");
    for r in rows {
        let (m, o) = (r["memory_hit_ratio"].as_f64().unwrap(), r["overall_hit_ratio"].as_f64().unwrap());
        assert!(m > 0.0 && m <= o && o < 1.0, "{r}");
    }
    assert_eq!(rows[6]["reinsert_min_hits"].as_u64(), Some(0));
    assert!(rows[0]["reinserted"].as_u64().unwrap() > 0, "the ring turned and reinserted: {}", rows[0]);
}

#[test]
fn crash_loop_kills_and_checks_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("crash.json");
    let out = run_ok(
        bench().args(["crash-loop", "--cycles", "5", "--keys", "60", "--twins", "2", "--load", "200ms"]).args([
            "--larder".as_ref(),
            larder_bin().as_os_str(),
            "--json".as_ref(),
            json.as_os_str(),
        ]),
    );
    assert!(out.contains("5 kill -9 cycles"), "{out}");
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(f["cycles"], 5);
    assert!(f["acknowledged_writes"].as_u64().unwrap() > 0, "{f}");
    assert!(f["keys_checked"].as_u64().unwrap() >= 5 * 64, "every key, every cycle: {f}");
    for bad in ["resurrected_deletes", "stale", "wrong_bytes", "lost_acknowledged"] {
        assert_eq!(f[bad], 0, "{bad}: {f}");
    }
}
