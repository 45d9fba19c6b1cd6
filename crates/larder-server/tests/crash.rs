//! SIGKILL in the middle of concurrent PUTs. The failure this guards against: a restart that
//! serves a torn record, a value of another key, or an older value than one already
//! acknowledged. DESIGN §4: an acknowledged write has reached its volume file, so a process
//! crash loses nothing acknowledged, whatever the fsync policy; the only freedom is a PUT
//! still in flight at the kill, which may or may not have landed.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WRITERS: usize = 8;
const KEYS_PER_WRITER: usize = 40;

fn value(key: &str, version: u64) -> Vec<u8> {
    let mut v = format!("{key}#{version}#").into_bytes();
    let seed = version.wrapping_mul(31) ^ key.len() as u64 ^ key.bytes().map(u64::from).sum::<u64>() << 20;
    v.extend(bytes(seed, 64 + (version as usize * 97) % 6000));
    v
}

/// Per key: the last acknowledged version and the version in flight (if any).
#[derive(Clone, Copy, Default)]
struct KeyState {
    acked: u64,
    inflight: u64,
}

fn run(fsync: &str) {
    let mut s = Server::start(&["--fsync", fsync, "--volume-size", "1MiB", "--volume-count", "8"]);
    let model: Arc<Vec<Mutex<KeyState>>> = Arc::new((0..WRITERS * KEYS_PER_WRITER).map(|_| Mutex::default()).collect());
    let mut checked = 0;
    let acks = Arc::new(AtomicU64::new(0));
    for round in 0..6u64 {
        let acks_before = acks.load(Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (model, stop, acks, addr) = (model.clone(), stop.clone(), acks.clone(), s.addr);
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let k = w * KEYS_PER_WRITER + n % KEYS_PER_WRITER;
                        n += 1;
                        let version = {
                            let mut st = model[k].lock().unwrap();
                            st.inflight = st.acked.max(st.inflight) + 1;
                            st.inflight
                        };
                        let key = format!("crash/{k}");
                        match c.try_request("PUT", &format!("/{key}"), &[], &value(&key, version)) {
                            Ok(r) if r.status == 200 => {
                                model[k].lock().unwrap().acked = version;
                                acks.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => panic!("PUT answered {}", r.status),
                            Err(_) => return, // killed: this version stays in flight
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(40 + round * 60));
        s.kill();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let in_flight = model
            .iter()
            .filter(|st| {
                let st = st.lock().unwrap();
                st.inflight > st.acked
            })
            .count();
        assert!(acks.load(Ordering::Relaxed) > acks_before, "round {round}: the kill came before any PUT");
        assert!(in_flight > 0, "round {round}: the kill did not land mid-load");
        s.restart();
        let mut c = s.client();
        for (k, st) in model.iter().enumerate() {
            let mut st = st.lock().unwrap();
            let key = format!("crash/{k}");
            let r = c.get(&format!("/{key}"));
            let got = match r.status {
                404 => 0,
                200 => {
                    let text = String::from_utf8_lossy(&r.body[..r.body.len().min(40)]).to_string();
                    let version: u64 = text
                        .split('#')
                        .nth(1)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("{key}: foreign bytes {text:?}"));
                    assert_eq!(r.body, value(&key, version), "{key}: bytes differ from version {version}");
                    version
                }
                other => panic!("{key}: GET answered {other}"),
            };
            assert!(
                got == st.acked || (got == st.inflight && got > st.acked),
                "{key} ({fsync}, round {round}): got version {got}, acknowledged {}, in flight {}",
                st.acked,
                st.inflight
            );
            // What is on disk now is the truth the next round builds on.
            st.acked = got;
            st.inflight = got;
            checked += 1;
        }
    }
    println!("fsync {fsync}: 6 kill points, {} PUTs acknowledged, {checked} key checks", acks.load(Ordering::Relaxed));
}

#[test]
fn sigkill_with_background_fsync() {
    run("1s");
}

#[test]
fn sigkill_with_fsync_always() {
    run("always");
}
