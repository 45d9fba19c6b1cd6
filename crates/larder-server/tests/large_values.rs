//! Values longer than a chunk over HTTP: uploads go to disk chunk by chunk as they arrive and
//! downloads are sent chunk by chunk, so the server's memory stays bounded whatever the size.

mod common;
use common::{bytes, peak_growth, Server};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

const MIB: usize = 1 << 20;

fn server() -> Server {
    // A ring of 1 GiB (a quarter of it, 256 MiB, is the largest value), chunks of 1 MiB.
    Server::start(&["--volume-size", "64MiB", "--volume-count", "16", "--chunk-size", "1MiB", "--memory-capacity", "0"])
}

#[test]
fn a_large_value_streams_in_and_out_in_bounded_memory() {
    let s = server();
    let value = bytes(19, 96 * MIB + 12_345);
    let mut c = s.client();
    let (r, up) = peak_growth(&s, || c.put("/big", &value));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let etag = r.header("etag").unwrap().to_string();
    let (r, down) = peak_growth(&s, || c.get("/big"));
    assert_eq!(r.status, 200);
    assert!(r.body == value, "the value came back different");
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    println!("server RSS growth: upload {} MiB, download {} MiB", up >> 20, down >> 20);
    assert!(up < 32 << 20 && down < 32 << 20, "memory grew by {} / {} MiB for a 96 MiB value", up >> 20, down >> 20);
    // A range across a chunk boundary, and one at the end.
    for (from, to) in [(MIB - 10, MIB + 9), (value.len() - 100, value.len() - 1)] {
        let r = c.request("GET", "/big", &[("Range", &format!("bytes={from}-{to}"))], b"");
        assert_eq!(r.status, 206);
        assert!(r.body == value[from..=to], "range {from}-{to}");
    }
    // A revalidation needs the head only.
    let reads = s.stats()["disk_reads"].as_u64().unwrap();
    let r = c.request("GET", "/big", &[("If-None-Match", &etag)], b"");
    assert_eq!(r.status, 304);
    assert_eq!(s.stats()["disk_reads"].as_u64().unwrap() - reads, 1, "a 304 read more than the head");
}

#[test]
fn a_chunked_upload_of_unknown_length_is_stored_and_one_cut_short_leaves_the_old_value() {
    let s = server();
    let value = bytes(23, 5 * MIB + 777);
    let mut c = s.client();
    c.raw(b"PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    for piece in value.chunks(300_000) {
        c.raw(format!("{:x}\r\n", piece.len()).as_bytes()).unwrap();
        c.raw(piece).unwrap();
        c.raw(b"\r\n").unwrap();
    }
    c.raw(b"0\r\n\r\n").unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(c.get("/k").body == value);
    // An upload that stops half way (the client goes away): the key keeps its value.
    let mut gone = std::net::TcpStream::connect(s.addr).unwrap();
    let other = bytes(29, 4 * MIB);
    gone.write_all(format!("PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", other.len()).as_bytes())
        .unwrap();
    gone.write_all(&other[..3 * MIB]).unwrap();
    drop(gone);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(s.client().get("/k").body == value, "a cut upload replaced the value");
}

#[test]
fn a_kill_during_an_upload_that_overwrites_a_key_leaves_its_previous_value() {
    let mut s = server();
    let old = bytes(31, 3 * MIB);
    assert_eq!(s.client().put("/k", &old).status, 200);
    assert_eq!(s.client().put("/other", b"intact").status, 200);
    let new = bytes(37, 40 * MIB);
    let before = s.stats()["bytes_used"].as_u64().unwrap();
    let mut up = std::net::TcpStream::connect(s.addr).unwrap();
    up.write_all(format!("PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", new.len()).as_bytes()).unwrap();
    up.write_all(&new[..30 * MIB]).unwrap();
    // Wait until chunks of it are on disk, then kill the server mid-upload.
    let started = std::time::Instant::now();
    while s.stats()["bytes_used"].as_u64().unwrap() < before + 20 * MIB as u64 {
        assert!(started.elapsed().as_secs() < 20, "the upload never reached the disk: {}", s.stats());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    s.kill();
    drop(up);
    s.restart();
    let mut c = s.client();
    assert!(c.get("/k").body == old, "the key lost its previous value");
    assert_eq!(c.get("/other").body, b"intact");
}

#[test]
fn a_large_value_that_lost_its_first_chunk_is_a_clean_404_before_and_after_a_restart() {
    // A ring of 16 × 4 MiB: a 10 MiB value spans three or four volumes.
    let mut s = Server::start(&["--volume-size", "4MiB", "--volume-count", "16", "--chunk-size", "1MiB"]);
    let mut c = s.client();
    assert_eq!(c.put("/big", &bytes(41, 10 * MIB)).status, 200);
    // Fill the ring until the value is gone: its first chunk's volume goes before its head's.
    let filler = bytes(43, 900 << 10);
    let mut i = 0;
    loop {
        let r = c.request("HEAD", "/big", &[], b"");
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 200);
        assert_eq!(c.put(&format!("/fill{i}"), &filler).status, 200);
        i += 1;
        assert!(i < 200, "the value outlived the ring");
    }
    let r = c.get("/big");
    assert_eq!((r.status, r.body.len()), (404, "not found\n".len()), "no part of the value is sent");
    s.stop();
    s.restart();
    assert_eq!(s.client().get("/big").status, 404, "the value came back after a restart");
}

#[test]
fn a_flipped_byte_in_a_middle_chunk_never_completes_a_200() {
    let mut s = server();
    let value = bytes(47, 8 * MIB);
    assert_eq!(s.client().put("/big", &value).status, 200);
    let pos = s.client().request("HEAD", "/big", &[], b"").header("x-position").unwrap().to_string();
    let mut p = pos.split(',').map(|x| x.parse::<u64>().unwrap());
    let (volume, head_at) = (p.next().unwrap(), p.next().unwrap());
    s.stop();
    // The chunks precede their head: 4 MiB before it lies the middle of the value.
    let path = s.dir.join(format!("vol-{volume:05}.lrv"));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let at = head_at - 4 * MIB as u64;
    let mut b = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[b[0] ^ 0x10], at).unwrap();
    drop(f);
    s.restart();
    let before = s.stats()["corrupt_reads"].as_u64().unwrap();
    // Twice, as the key is dropped by the first: once by the client into a file, which must
    // fail and leave no partial file, once by HTTP (after a copy is stored again).
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("big.bin");
    let url = format!("http://{}", s.addr);
    let (got, _) = larder_client(&["get", "big", "--url", &url, "--output", out.to_str().unwrap()], None);
    assert_ne!(got.status.code(), Some(0), "the client took a cut-short value for whole");
    assert!(!out.exists(), "a cut-short value left a partial file");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "the client's temporary file stayed");
    assert!(s.stats()["corrupt_reads"].as_u64().unwrap() > before, "the damage is not counted");
    assert_eq!(s.client().get("/big").status, 404, "the key is not dropped");
    assert_eq!(s.client().put("/big", &value).status, 200);
    let pos = s.client().request("HEAD", "/big", &[], b"").header("x-position").unwrap().to_string();
    let mut p = pos.split(',').map(|x| x.parse::<u64>().unwrap());
    let (volume, head_at) = (p.next().unwrap(), p.next().unwrap());
    s.stop();
    let f =
        std::fs::OpenOptions::new().read(true).write(true).open(s.dir.join(format!("vol-{volume:05}.lrv"))).unwrap();
    let at = head_at - 4 * MIB as u64;
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[b[0] ^ 0x10], at).unwrap();
    drop(f);
    s.restart();
    let before = s.stats()["corrupt_reads"].as_u64().unwrap();
    match s.client().try_request("GET", "/big", &[], b"") {
        Ok(r) => assert_ne!(r.status, 200, "a 200 answer completed, though a chunk is damaged"),
        Err(e) => println!("the answer was cut short: {e}"),
    }
    assert!(s.stats()["corrupt_reads"].as_u64().unwrap() > before, "the damage is not counted");
    assert_eq!(s.client().get("/big").status, 404, "the key is not dropped");
}

/// Runs the `larder` client and returns its output and the highest resident memory seen while
/// it ran (its `VmHWM`, sampled until it exits).
fn larder_client(args: &[&str], stdin: Option<&std::path::Path>) -> (std::process::Output, u64) {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_larder"));
    cmd.env_remove("LARDER_AUTH_TOKEN").env_remove("LARDER_URL").args(args).stdout(Stdio::piped());
    cmd.stderr(Stdio::piped());
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).unwrap()),
        None => cmd.stdin(Stdio::null()),
    };
    let child = cmd.spawn().unwrap();
    let status = format!("/proc/{}/status", child.id());
    let peak = std::sync::Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        std::thread::spawn(move || {
            while let Ok(s) = std::fs::read_to_string(&status) {
                let Some(kib) = s.lines().find_map(|l| l.strip_prefix("VmHWM:")) else { break };
                let kib: u64 = kib.trim().trim_end_matches("kB").trim().parse().unwrap();
                peak.fetch_max(kib << 10, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let out = child.wait_with_output().unwrap();
    sampler.join().unwrap();
    (out, peak.load(Ordering::Relaxed))
}

#[test]
fn the_client_streams_a_large_file_both_ways() {
    let s = server();
    let url = format!("http://{}", s.addr);
    let tmp = tempfile::tempdir().unwrap();
    let (file, back) = (tmp.path().join("in.bin"), tmp.path().join("out.bin"));
    let value = bytes(53, 48 * MIB + 5);
    std::fs::write(&file, &value).unwrap();
    let (put, put_peak) = larder_client(&["put", "video", file.to_str().unwrap(), "--url", &url], None);
    assert_eq!(put.status.code(), Some(0), "{}", String::from_utf8_lossy(&put.stderr));
    let (get, get_peak) = larder_client(&["get", "video", "--url", &url, "--output", back.to_str().unwrap()], None);
    assert_eq!(get.status.code(), Some(0), "{}", String::from_utf8_lossy(&get.stderr));
    assert!(std::fs::read(&back).unwrap() == value, "the file came back different");
    // From standard input, of unknown length (sent chunked).
    let (piped, _) = larder_client(&["put", "piped", "--url", &url], Some(&file));
    assert_eq!(piped.status.code(), Some(0), "{}", String::from_utf8_lossy(&piped.stderr));
    assert!(s.client().get("/piped").body == value);
    println!("client peak RSS: put {} MiB, get {} MiB", put_peak >> 20, get_peak >> 20);
    assert!(put_peak < 24 << 20 && get_peak < 24 << 20, "the client held the value: {put_peak} / {get_peak} bytes");
}

/// Disk blocks the data directory's files occupy, as `du` counts them.
fn du(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().unwrap().blocks() * 512).sum()
}

#[test]
fn a_gibibyte_value_goes_in_with_a_length_and_chunked_comes_back_in_ranges_and_is_freed_at_once() {
    // A ring of 16 × 256 MiB: a quarter of it is 1 GiB. Chunks of 1 MiB (the default).
    let mut s = Server::start(&["--volume-size", "256MiB", "--volume-count", "16", "--memory-capacity", "0"]);
    let value = bytes(61, 1 << 30);
    let mut c = s.client();
    let (r, up) = peak_growth(&s, || c.put("/gib", &value));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let etag = r.header("etag").unwrap().to_string();
    let (r, down) = peak_growth(&s, || c.get("/gib"));
    assert_eq!(r.status, 200);
    assert!(r.body == value, "the value came back different");
    drop(r);
    // The same bytes, chunked, under another key.
    let (r, chunked) = peak_growth(&s, || {
        c.raw(b"PUT /gib2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        for piece in value.chunks(4 * MIB) {
            c.raw(format!("{:x}\r\n", piece.len()).as_bytes()).unwrap();
            c.raw(piece).unwrap();
            c.raw(b"\r\n").unwrap();
        }
        c.raw(b"0\r\n\r\n").unwrap();
        c.read_response(false).unwrap()
    });
    assert_eq!(r.status, 200);
    let (r, chunked_down) = peak_growth(&s, || c.get("/gib2"));
    assert!(r.body == value, "the chunked value came back different");
    drop(r);
    println!(
        "server RSS growth, 1 GiB: upload {} MiB, download {} MiB; chunked upload {} MiB, download {} MiB",
        up >> 20,
        down >> 20,
        chunked >> 20,
        chunked_down >> 20
    );
    assert!(up < 64 << 20 && down < 64 << 20 && chunked < 64 << 20 && chunked_down < 64 << 20);

    // Ranges at the start, across a chunk boundary, in the middle and at the end.
    let n = value.len();
    for (from, to) in [(0, 99), (MIB - 10, MIB + 9), (n / 2 - 3 * MIB, n / 2 + 3 * MIB), (n - 100, n - 1)] {
        let r = c.request("GET", "/gib", &[("Range", &format!("bytes={from}-{to}"))], b"");
        assert_eq!(r.status, 206);
        assert!(r.body == value[from..=to], "range {from}-{to}");
    }
    // A revalidation reads the head only (large values skip the memory tier). Its chunk table
    // (1024 entries, 32 KiB) is longer than a read of a record's front, so the head takes two
    // reads, the front and then the whole; a chunk would be a third.
    let reads = s.stats()["disk_reads"].as_u64().unwrap();
    let r = c.request("GET", "/gib", &[("If-None-Match", &etag)], b"");
    assert_eq!(r.status, 304);
    assert_eq!(s.stats()["disk_reads"].as_u64().unwrap() - reads, 2, "a 304 read more than the head");

    // Deleting one and overwriting the other gives their blocks back within seconds.
    for (end, key) in [("DELETE", "/gib"), ("PUT", "/gib2")] {
        let before = du(&s.dir);
        let r = c.request(end, key, &[], if end == "PUT" { &b"small now"[..] } else { b"" });
        assert_eq!(r.status, 200);
        let started = std::time::Instant::now();
        while before.saturating_sub(du(&s.dir)) < 900 << 20 {
            assert!(started.elapsed().as_secs() < 5, "{end}: {} MiB freed in 5 s", (before - du(&s.dir)) >> 20);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        println!("{end}: {} MiB freed in {:?}", (before - du(&s.dir)) >> 20, started.elapsed());
    }
    // All but the page or two around each chunk's header: about 99.6% of 2 GiB.
    let started = std::time::Instant::now();
    while s.stats()["punched_bytes"].as_u64().unwrap() < 2000 << 20 {
        assert!(started.elapsed().as_secs() < 5, "{} punched", s.stats()["punched_bytes"]);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Neither `larder check` nor recovery takes the holes for damage.
    s.stop();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_larder"))
        .args(["check", s.dir.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&check.stderr));
    s.restart();
    assert_eq!(s.stats()["recovery"]["skipped"], 0, "a punched range taken for damage");
    assert_eq!(s.client().get("/gib2").body, b"small now");
    assert_eq!(s.client().get("/gib").status, 404);
}

#[test]
fn eight_concurrent_large_uploads_and_downloads_stay_in_bounded_memory() {
    let s = Server::start(&["--volume-size", "256MiB", "--volume-count", "16", "--memory-capacity", "0"]);
    let values: Vec<Vec<u8>> = (0..8).map(|i| bytes(70 + i, 128 * MIB)).collect();
    let (_, up) = peak_growth(&s, || {
        std::thread::scope(|scope| {
            for (i, v) in values.iter().enumerate() {
                let mut c = s.client();
                scope.spawn(move || assert_eq!(c.put(&format!("/v{i}"), v).status, 200));
            }
        })
    });
    let (_, down) = peak_growth(&s, || {
        std::thread::scope(|scope| {
            for (i, v) in values.iter().enumerate() {
                let mut c = s.client();
                scope.spawn(move || assert!(c.get(&format!("/v{i}")).body == *v, "value {i} came back different"));
            }
        })
    });
    println!("server RSS growth, 8 × 128 MiB: uploads {} MiB, downloads {} MiB", up >> 20, down >> 20);
    assert!(up < 128 << 20 && down < 128 << 20);
}
