//! 32 clients doing PUT/GET/DELETE on overlapping keys. Values embed their key and a per-key
//! sequence number. Writers of one key take turns (a per-key lock in the test), so sequence
//! order is acknowledgement order; readers take no lock. No GET may return bytes written for
//! another key, none may return a sequence older than one acknowledged before it started, and
//! none may miss a key that was present when it started while no write of it was under way.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: usize = 24;

fn value(key: usize, seq: u64) -> Vec<u8> {
    let mut v = format!("{key}:{seq}:").into_bytes();
    v.extend(bytes(key as u64 * 1_000_003 + seq, 50 + (seq as usize * 7919) % 9000));
    v
}

#[test]
fn mixed_load_never_returns_foreign_or_stale_values() {
    let s = Server::start(&["--volume-size", "2MiB", "--volume-count", "64"]);
    let next_seq: Arc<Vec<Mutex<u64>>> = Arc::new((0..KEYS).map(|_| Mutex::new(0)).collect());
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    // Per key: writes begun (bumped before each PUT or DELETE is sent) and whether the last
    // acknowledged write left the key present (cleared before a DELETE is sent).
    let begun: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let present: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let deadline = Instant::now() + Duration::from_secs(4);
    let handles: Vec<_> = (0..32u64)
        .map(|t| {
            let (next_seq, acked, addr) = (next_seq.clone(), acked.clone(), s.addr);
            let (begun, present) = (begun.clone(), present.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut x = t.wrapping_mul(0x9E37_79B9) | 1;
                let (mut gets, mut hits) = (0u64, 0u64);
                while Instant::now() < deadline {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % KEYS as u64) as usize;
                    let path = format!("/c/{k}");
                    match x % 10 {
                        0..=3 => {
                            let mut seq = next_seq[k].lock().unwrap();
                            *seq += 1;
                            begun[k].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(c.put(&path, &value(k, *seq)).status, 200);
                            acked[k].store(*seq, Ordering::SeqCst);
                            present[k].store(true, Ordering::SeqCst);
                        }
                        4 => {
                            let _turn = next_seq[k].lock().unwrap();
                            present[k].store(false, Ordering::SeqCst);
                            begun[k].fetch_add(1, Ordering::SeqCst);
                            let st = c.delete(&path).status;
                            assert!(st == 200 || st == 404, "DELETE answered {st}");
                        }
                        _ => {
                            let writes_before = begun[k].load(Ordering::SeqCst);
                            let was_present = present[k].load(Ordering::SeqCst);
                            let floor = acked[k].load(Ordering::SeqCst);
                            let r = c.get(&path);
                            gets += 1;
                            if r.status == 404 {
                                let quiet = begun[k].load(Ordering::SeqCst) == writes_before;
                                assert!(!(was_present && quiet), "GET {path} missed a present key");
                                continue;
                            }
                            assert_eq!(r.status, 200);
                            hits += 1;
                            let head = String::from_utf8_lossy(&r.body[..r.body.len().min(30)]).to_string();
                            let mut parts = head.split(':');
                            let key: usize = parts.next().unwrap().parse().unwrap_or(usize::MAX);
                            let seq: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                            assert_eq!(key, k, "GET {path} returned a value of another key");
                            assert_eq!(r.body, value(k, seq), "GET {path}: bytes differ");
                            assert!(seq >= floor, "GET {path} returned seq {seq} after {floor} was acknowledged");
                        }
                    }
                }
                (gets, hits)
            })
        })
        .collect();
    let (mut gets, mut hits) = (0, 0);
    for h in handles {
        let (g, ht) = h.join().unwrap();
        gets += g;
        hits += ht;
    }
    println!("{gets} GETs checked, {hits} returned values");
    assert!(hits > 1000, "too few values read to mean anything: {hits}");
}
