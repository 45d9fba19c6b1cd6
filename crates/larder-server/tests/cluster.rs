//! A cluster behind Debian's nginx (deploy/nginx/run-cluster, deploy/nginx/larder-cluster.conf):
//! 10,000 keys through nginx to three nodes, each node's share, a node stopped (its keys
//! answer 503 at once, a PUT of one is refused and stored nowhere else, the other keys are
//! served), the node back, then a fourth node added: the keys that move, measured. Every
//! key's node is also computed from the placement hash as docs/CLUSTER.md specifies it and
//! must be the node nginx chose.
//!
//! nginx is installed by scripts/install-bench-deps.sh (the test command runs it); without it
//! run-cluster fails and so does this test.

mod common;
use common::{bytes, Client};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: usize = 10_000;
const VALUE: usize = 200;

fn run_cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx/run-cluster")
}

/// A running `run-cluster`; SIGTERM on drop, so that nothing outlives a failed test.
struct Cluster {
    child: Option<Child>,
    base: u16,
}

impl Cluster {
    fn start(n: usize, base: u16, dir: &Path) -> Cluster {
        let mut child = Command::new(run_cluster_script())
            .arg(n.to_string())
            .arg(base.to_string())
            .env("LARDER_BIN", env!("CARGO_BIN_EXE_larder"))
            .env("CLUSTER_DIR", dir)
            .env("READY_TIMEOUT", "60")
            .env("RING_AWARE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run deploy/nginx/run-cluster");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let cluster = Cluster { child: Some(child), base };
        match rx.recv_timeout(Duration::from_secs(90)) {
            Ok(line) if line == "cluster ready" => cluster,
            other => panic!("run-cluster did not print `cluster ready` (got {other:?}); is nginx installed?"),
        }
    }

    /// SIGTERM; run-cluster must stop every node and nginx and exit 0.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        signal("TERM", child.id());
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "run-cluster did not stop");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "run-cluster exited with {status}");
        for port in self.base..=self.base + 4 {
            assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "127.0.0.1:{port} still answers");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal("TERM", c.id());
            let _ = c.wait();
        }
    }
}

fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Runs `f(client, i)` for every key index on four connections to `port`.
fn each_key<T: Send>(port: u16, keys: &[usize], f: impl Fn(&mut Client, usize) -> T + Sync) -> Vec<T> {
    let chunks: Vec<&[usize]> = keys.chunks(keys.len().div_ceil(4).max(1)).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let f = &f;
                s.spawn(move || {
                    let mut c = Client::connect(addr(port));
                    chunk.iter().map(|&i| f(&mut c, i)).collect::<Vec<T>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

fn key(i: usize) -> String {
    format!("/c/{i}")
}

/// nginx's `hash $request_uri consistent`, as docs/CLUSTER.md specifies it: 160 points per
/// server (weight 1), each the CRC32 of host, a zero byte, port, and the previous point's
/// hash (4 bytes, little-endian, starting at 0); a key goes to the first point at or after
/// the CRC32 of its request URI, wrapping around.
struct Ring(Vec<(u32, usize)>);

impl Ring {
    fn new(servers: &[String]) -> Ring {
        let mut points = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            let (host, port) = s.rsplit_once(':').expect("host:port");
            let mut base = crc32fast::Hasher::new();
            base.update(host.as_bytes());
            base.update(&[0]);
            base.update(port.as_bytes());
            let mut prev = 0u32;
            for _ in 0..160 {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, i));
            }
        }
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        Ring(points)
    }

    fn owner(&self, uri: &str) -> usize {
        let h = crc32fast::hash(uri.as_bytes());
        let at = self.0.partition_point(|p| p.0 < h);
        self.0[at % self.0.len()].1
    }
}

fn nodes(base: u16, n: usize) -> Vec<String> {
    (1..=n).map(|k| format!("127.0.0.1:{}", base + k as u16)).collect()
}

/// The node (0-based) an answer came from, by nginx's `X-Larder-Node`.
fn answered_by(r: &common::Resp, base: u16) -> Option<usize> {
    let port: u16 = r.header("x-larder-node")?.rsplit_once(':')?.1.parse().ok()?;
    Some((port - base - 1) as usize)
}

#[test]
fn three_nodes_behind_nginx_then_one_down_then_a_fourth() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let base = common::free_ports(4);
    let all: Vec<usize> = (0..KEYS).collect();
    let cluster = Cluster::start(3, base, &dir);

    // 10,000 keys through nginx, each on the node the placement hash names.
    let ring3 = Ring::new(&nodes(base, 3));
    let owners = each_key(base, &all, |c, i| {
        let r = c.put(&key(i), &bytes(i as u64, VALUE));
        assert_eq!(r.status, 200, "PUT {}: {}", key(i), String::from_utf8_lossy(&r.body));
        answered_by(&r, base).expect("X-Larder-Node")
    });
    let mismatched = (0..KEYS).filter(|&i| owners[i] != ring3.owner(&key(i))).count();
    assert_eq!(mismatched, 0, "keys whose node differs from docs/CLUSTER.md's hash");
    // larder's own ring awareness agrees: `larder owner` names nginx's node for every key, and
    // no node counted a foreign write (each was given only keys it owns).
    let out = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["owner", "--cluster-hash", "nginx", "--cluster-nodes", &nodes(base, 3).join(",")])
        .args((0..KEYS).map(key))
        .output()
        .unwrap();
    assert!(out.status.success(), "larder owner: {}", String::from_utf8_lossy(&out.stderr));
    let named: Vec<String> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| l.split('\t').nth(1).unwrap().to_string()).collect();
    let disagree = (0..KEYS).filter(|&i| named[i] != nodes(base, 3)[owners[i]]).count();
    assert_eq!((named.len(), disagree), (KEYS, 0), "keys whose owner larder computes differs from nginx's");
    for k in 0..3 {
        let r = Client::connect(addr(base + 1 + k as u16)).get("/_larder/stats");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["cluster"]["foreign_writes"], 0, "node {}: {}", k + 1, v["cluster"]);
    }
    each_key(base, &all, |c, i| {
        let r = c.get(&key(i));
        assert_eq!((r.status, r.body == bytes(i as u64, VALUE)), (200, true), "GET {}", key(i));
    });
    for k in 0..3 {
        let r = Client::connect(addr(base + 1 + k as u16)).get("/_larder/stats");
        let keys = serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["keys"].as_u64().unwrap();
        let share = keys as f64 / KEYS as f64;
        println!("node {}: {keys} keys ({:.1}%)", k + 1, share * 100.0);
        assert!((0.25..=0.41).contains(&share), "node {} holds {:.1}% of the keys", k + 1, share * 100.0);
        assert_eq!(keys as usize, owners.iter().filter(|&&o| o == k).count());
    }
    // A value past nginx's old 1 MiB limit passes: the shipped config forwards any value a node
    // takes (--max-value-size, 1 GiB by default), streamed.
    let big = bytes(7, 3 << 20);
    let mut c = Client::connect(addr(base));
    assert_eq!(c.put("/c/big", &big).status, 200);
    let r = c.get("/c/big");
    assert_eq!((r.status, r.body.len(), r.body == big), (200, big.len(), true));

    // Node 2 stops.
    let pid_file = dir.join("node-2.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    signal("TERM", pid);
    // Gone, not just closed to new connections: a stopping node still answers on the
    // connections nginx keeps open until it has drained them.
    let start = Instant::now();
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
    };
    while running() {
        assert!(start.elapsed() < Duration::from_secs(30), "node 2 did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let theirs: Vec<usize> = all.iter().copied().filter(|&i| owners[i] == 1).collect();
    let others: Vec<usize> = all.iter().copied().filter(|&i| owners[i] != 1).collect();
    each_key(base, &others, |c, i| {
        let r = c.get(&key(i));
        assert_eq!((r.status, r.body == bytes(i as u64, VALUE)), (200, true), "GET {} with node 2 down", key(i));
    });
    // Its keys: 503 at once (nginx cannot connect and does not try another node).
    let slowest = each_key(base, &theirs, |c, i| {
        let t = Instant::now();
        let r = c.get(&key(i));
        assert_eq!(r.status, 503, "GET {} of the stopped node", key(i));
        t.elapsed()
    });
    let slowest = slowest.into_iter().max().unwrap();
    println!("{} keys of the stopped node: 503, slowest answer {slowest:?}", theirs.len());
    assert!(slowest < Duration::from_secs(1), "an answer for the stopped node took {slowest:?}");
    // A PUT of one of its keys is refused, and stored on no other node.
    let victim = theirs[0];
    let mut c = Client::connect(addr(base));
    let r = c.put(&key(victim), b"must not be stored");
    assert_eq!(r.status, 503, "PUT to a stopped owner: {}", String::from_utf8_lossy(&r.body));
    assert_eq!(c.delete(&key(theirs[1])).status, 503);
    for port in [base + 1, base + 3] {
        assert_eq!(Client::connect(addr(port)).get(&key(victim)).status, 404, "stored on 127.0.0.1:{port}");
    }

    // Node 2 back on its data: its keys are served again, with their values from before.
    let mut node2 = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", base + 2), "--data-dir"])
        .arg(dir.join("node-2"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(&pid_file, node2.id().to_string()).unwrap(); // run-cluster stops it at exit
    let start = Instant::now();
    let up = || {
        TcpStream::connect(addr(base + 2)).is_ok()
            && Client::connect(addr(base + 2)).get("/_larder/health").status == 200
    };
    while !up() {
        assert!(start.elapsed() < Duration::from_secs(60), "node 2 did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    each_key(base, &theirs, |c, i| {
        let r = c.get(&key(i));
        assert_eq!((r.status, r.body == bytes(i as u64, VALUE)), (200, true), "GET {} after node 2 is back", key(i));
    });
    cluster.stop();
    let _ = node2.wait();

    // Three nodes become four, on the same data: a key that moved is a miss on node 4.
    let cluster = Cluster::start(4, base, &dir);
    let ring4 = Ring::new(&nodes(base, 4));
    let moved = each_key(base, &all, |c, i| {
        let r = c.get(&key(i));
        let now = answered_by(&r, base).expect("X-Larder-Node");
        assert_eq!(now, ring4.owner(&key(i)), "{} went to another node than the hash says", key(i));
        match r.status {
            404 => {
                assert_eq!(now, 3, "{} moved, but not to the new node", key(i));
                true
            }
            200 => {
                assert_eq!(r.body, bytes(i as u64, VALUE));
                false
            }
            s => panic!("GET {}: {s}", key(i)),
        }
    });
    let moved = moved.iter().filter(|&&m| m).count();
    let fraction = moved as f64 / KEYS as f64;
    println!("3 -> 4 nodes: {moved} of {KEYS} keys moved ({:.1}%; ideal 25%)", fraction * 100.0);
    assert!((0.15..=0.35).contains(&fraction), "{:.1}% of the keys moved", fraction * 100.0);
    // `larder flush --cluster` flushes every node of an nginx ring over HTTP.
    let out = Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["flush", "--cluster", "--cluster-hash", "nginx", "--cluster-nodes", &nodes(base, 4).join(",")])
        .output()
        .unwrap();
    assert!(out.status.success(), "larder flush --cluster: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("\tflushed").count(), 4);
    let found = each_key(base, &all, |c, i| c.get(&key(i)).status == 200);
    assert_eq!(found.iter().filter(|&&f| f).count(), 0, "keys served after the cluster was flushed");
    cluster.stop();
}
