//! Backpressure, not drops: clients PUT as fast as they can and every acknowledged value
//! reads back exactly.

mod common;
use common::*;

fn blast(clients: usize, values: usize, size: usize) {
    let s = Server::start(&["--volume-size", "64MiB", "--volume-count", "32"]);
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let addr = s.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for i in (t..values).step_by(clients) {
                    let r = c.put(&format!("/v/{i}"), &bytes(i as u64, size));
                    assert_eq!(r.status, 200, "PUT {i}: {}", String::from_utf8_lossy(&r.body));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut c = s.client();
    for i in 0..values {
        let r = c.get(&format!("/v/{i}"));
        assert_eq!(r.status, 200, "v/{i} missing");
        assert!(r.body == bytes(i as u64, size), "v/{i} differs");
    }
    assert_eq!(s.stats()["keys"], values as u64);
}

#[test]
fn sixteen_clients_64k_values() {
    blast(16, 1500, 64 << 10);
}

#[test]
fn four_clients_1m_values() {
    blast(4, 1500, 1 << 20);
}
