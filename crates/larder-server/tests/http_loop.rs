//! The HTTP event loops (`conn/reactor.rs`) where they part from the plain path: an answer
//! that must wait hands the connection to the runtime in the middle of a pipelined batch,
//! and a client that does not read holds up only its own connection.

mod common;
use common::{bytes, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Reads `n` answers off `c`: each status and body (by its `content-length`).
fn answers(c: &mut TcpStream, n: usize) -> Vec<(u16, Vec<u8>)> {
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    while out.len() < n {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head[9..12].parse().unwrap();
            let len: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length: ")).map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                out.push((status, buf[end + 4..end + 4 + len].to_vec()));
                buf.drain(..end + 4 + len);
                continue;
            }
        }
        let k = c.read(&mut chunk).expect("an answer");
        assert!(k > 0, "closed after {} of {n} answers", out.len());
        buf.extend_from_slice(&chunk[..k]);
    }
    out
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: l\r\n\r\n").into_bytes()
}

fn put(path: &str, body: &[u8]) -> Vec<u8> {
    [format!("PUT {path} HTTP/1.1\r\nHost: l\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(), body].concat()
}

/// A GET whose value must be read from a slow disk waits, and so leaves the event loop for
/// the runtime: the answers before it (already gathered), it, and the requests after it
/// (already read) all come back, in order, each with its own bytes.
#[test]
fn an_answer_that_must_wait_keeps_a_pipelined_batch_in_order() {
    // No memory tier: every GET reads the disk.
    let s = Server::start(&["--memory-capacity", "0", "--fsync", "never"]);
    let (a, b) = (bytes(1, 3000), bytes(2, 5000));
    let mut c = s.client();
    assert_eq!(c.put("/k/a", &a).status, 200);
    assert_eq!(c.put("/k/b", &b).status, 200);
    s.fault(Some("read delay ms=300"));
    let mut conn = TcpStream::connect(s.addr).unwrap();
    let batch = [put("/k/c", b"see"), get("/k/a"), put("/k/d", b"dee"), get("/k/b"), get("/k/none"), get("/k/c")];
    let started = Instant::now();
    conn.write_all(&batch.concat()).unwrap();
    let got = answers(&mut conn, 6);
    assert!(started.elapsed() >= Duration::from_millis(300), "the reads were not delayed");
    s.fault(None);
    let want: Vec<(u16, &[u8])> =
        vec![(200, b"stored\n"), (200, &a), (200, b"stored\n"), (200, &b), (404, b"not found\n"), (200, b"see")];
    let got: Vec<(u16, &[u8])> = got.iter().map(|(s, b)| (*s, &b[..])).collect();
    assert!(
        got == want,
        "answers out of order or wrong: {:?}",
        got.iter().map(|(s, b)| (s, b.len())).collect::<Vec<_>>()
    );
    // The connection goes on serving, on the runtime now.
    conn.write_all(&get("/k/d")).unwrap();
    assert_eq!(answers(&mut conn, 1), vec![(200, b"dee".to_vec())]);
}

/// A client that sends many GETs of a large value and reads none of the answers fills its
/// socket: its loop then waits for the socket to take them, answering nothing more for it,
/// while other connections on the same loop are answered at once. Once the client reads,
/// every answer arrives whole.
#[test]
fn a_client_that_does_not_read_holds_up_only_its_own_connection() {
    let s = Server::start(&[]);
    let value = bytes(3, 48 << 10);
    let mut c = s.client();
    assert_eq!(c.put("/big", &value).status, 200);
    assert_eq!(c.get("/big").status, 200); // in the memory tier from now on
    let n = 400; // about 19 MiB of answers: far more than the sockets hold
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(&get("/big").repeat(n)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..20 {
        let started = Instant::now();
        let r = s.client().get("/big");
        assert!(r.status == 200 && r.body == value, "a GET beside the stalled client failed");
        assert!(started.elapsed() < Duration::from_secs(2), "GET {i} beside the stalled client waited");
    }
    let got = answers(&mut slow, n);
    assert!(got.iter().all(|(st, b)| *st == 200 && *b == value), "an answer to the stalled client was cut or wrong");
}

/// A client that sends a batch and closes its side at once (the close may come with the
/// last of the data, in one event) gets every answer, then the server's close: also when
/// the answers pass what one write gathers, so that answering stops to write midway.
#[test]
fn a_client_that_closes_its_side_gets_every_answer_then_the_close() {
    let s = Server::start(&[]);
    let value = bytes(4, 24 << 10);
    let mut c = s.client();
    assert_eq!(c.put("/v", &value).status, 200);
    assert_eq!(c.get("/v").status, 200);
    for n in [1, 3, 40] {
        let mut conn = TcpStream::connect(s.addr).unwrap();
        conn.write_all(&get("/v").repeat(n)).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let got = answers(&mut conn, n);
        assert!(got.iter().all(|(st, b)| *st == 200 && *b == value), "an answer of {n} was wrong");
        let mut rest = Vec::new();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let closed = conn.read_to_end(&mut rest);
        assert!(closed.is_ok() && rest.is_empty(), "after {n} answers: no close ({closed:?}), or more bytes");
    }
}
