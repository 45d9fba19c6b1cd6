//! Read-through mode in front of a real origin: Debian's nginx serving files, with the cache
//! headers its `expires` and `add_header` directives give and the validators (ETag,
//! Last-Modified) and 304s it produces itself. nginx is installed by
//! scripts/install-bench-deps.sh (the test command runs it); without it this test fails.

mod common;

use common::nginx::Nginx;
use common::{Resp, Server};
use std::path::Path;
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// nginx serving `dir/root` on a free port, in the foreground, every file of its in `dir`.
fn nginx(dir: &Path, port: u16) -> Nginx {
    let root = dir.join("root");
    let servers = format!(
        r#"  server {{
    listen 127.0.0.1:{port};
    root {root};
    location /expires/ {{ expires 60s; }}
    location /validated/ {{ add_header Cache-Control "max-age=1"; }}
    location /no-store/ {{ add_header Cache-Control "no-store"; }}
    location /varies/ {{ expires 60s; add_header Vary "Accept-Language"; }}
    location /heuristic/ {{ }}
  }}"#,
        root = root.display()
    );
    common::nginx::start(dir, port, &servers)
}

fn put_file(dir: &Path, path: &str, body: &[u8], age: Duration) {
    let p = dir.join("root").join(path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(std::time::SystemTime::now() - age).unwrap();
}

fn x_cache(r: &Resp) -> &str {
    r.header("x-cache").unwrap_or("")
}

#[test]
fn in_front_of_nginx_serving_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let day = Duration::from_secs(86_400);
    put_file(dir, "/expires/a.txt", b"expires body", day);
    put_file(dir, "/validated/b.txt", b"version one", day);
    put_file(dir, "/no-store/c.txt", b"never stored", day);
    put_file(dir, "/varies/d.txt", b"varies", day);
    put_file(dir, "/heuristic/e.txt", b"ten percent", 10 * day);
    let port = free_port();
    let mut origin = nginx(dir, port);
    let url = format!("http://127.0.0.1:{}", origin.port);
    let s = Server::start(&["--origin", &url, "--stale-if-error", "1h", "--origin-connect-timeout", "1s"]);
    let mut c = s.client();
    let get = |c: &mut common::Client, p: &str, h: &[(&str, &str)]| c.request("GET", p, h, b"");

    // Expires and max-age from nginx's `expires`; heuristic freshness from Last-Modified.
    for p in ["/expires/a.txt", "/heuristic/e.txt"] {
        let first = get(&mut c, p, &[]);
        assert_eq!((first.status, x_cache(&first)), (200, "MISS"), "{p}");
        let again = get(&mut c, p, &[]);
        assert_eq!((again.status, x_cache(&again), again.body.as_slice()), (200, "HIT", first.body.as_slice()), "{p}");
        assert_eq!(again.header("etag"), first.header("etag"), "{p}: nginx's validators are kept");
    }
    // no-store is passed through every time.
    for _ in 0..2 {
        assert_eq!(x_cache(&get(&mut c, "/no-store/c.txt", &[])), "PASS");
    }
    // Vary: one variant per Accept-Language.
    assert_eq!(x_cache(&get(&mut c, "/varies/d.txt", &[("accept-language", "en")])), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/varies/d.txt", &[("accept-language", "de")])), "MISS");
    assert_eq!(x_cache(&get(&mut c, "/varies/d.txt", &[("accept-language", "en")])), "HIT");

    // Revalidation: nginx answers the stored validators with 304, then a changed file with 200.
    let first = get(&mut c, "/validated/b.txt", &[]);
    assert_eq!(x_cache(&first), "MISS");
    std::thread::sleep(Duration::from_millis(1100));
    let r = get(&mut c, "/validated/b.txt", &[]);
    assert_eq!((r.status, x_cache(&r), r.body.as_slice()), (200, "REVALIDATED", &b"version one"[..]));
    std::thread::sleep(Duration::from_millis(1100));
    put_file(dir, "/validated/b.txt", b"version two", Duration::ZERO);
    let r = get(&mut c, "/validated/b.txt", &[]);
    assert_eq!((r.status, x_cache(&r), r.body.as_slice()), (200, "MISS", &b"version two"[..]));
    assert_ne!(r.header("etag"), first.header("etag"));
    let r = get(&mut c, "/validated/b.txt", &[("if-none-match", r.header("etag").unwrap())]);
    assert_eq!((r.status, x_cache(&r)), (304, "HIT"));

    // nginx stopped: the stale copy is served within --stale-if-error; a miss is 502.
    drop(origin);
    std::thread::sleep(Duration::from_millis(1100));
    let r = get(&mut c, "/validated/b.txt", &[]);
    assert_eq!((r.status, x_cache(&r), r.body.as_slice()), (200, "STALE", &b"version two"[..]));
    assert_eq!(get(&mut c, "/expires/a.txt", &[]).status, 200, "still fresh: no origin needed");
    assert_eq!(get(&mut c, "/expires/never.txt", &[]).status, 502);
    let m = c.request("GET", "/_larder/metrics", &[], b"");
    let text = String::from_utf8_lossy(&m.body);
    for line in
        ["larder_proxy_revalidations_total{result=\"304\"} 1", "larder_proxy_revalidations_total{result=\"200\"} 1"]
    {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    origin = nginx(dir, port);
    assert_eq!(get(&mut c, "/expires/never.txt", &[]).status, 404, "nginx is back: its 404");
    drop(origin);
}
