//! Differential test of the memcached text protocol: the same byte sequences go to Debian's
//! memcached 1.6 and to larder, and the answers must match byte for byte, but for the
//! documented differences (docs/MEMCACHED.md): cas uniques are compared by which answers
//! share one (each server numbers them its own way), and `version` and `stats` by shape.
//!
//! Each case runs on a fresh connection to each server, after a `flush_all`; each step is
//! followed by a meta get of a key no case uses, whose answer marks the end of the step's
//! answers; a case that closes the connection reads to the end instead.

mod common;

use common::Server;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's memcached on a free loopback port, stopped when dropped.
struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Memcached {
    fn start() -> Memcached {
        Memcached::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> Memcached {
        let bin = "/usr/bin/memcached";
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: scripts/install-bench-deps.sh installs Debian's memcached"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(bin)
            .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "64", "-t", "1", "-u", "nobody"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start memcached");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "memcached did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Memcached { child, addr }
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One step of a case: bytes to send (with `{cas}` standing for the last cas unique this
/// connection was given, and `{now+N}` for a Unix time), or a pause.
enum Step {
    Send(Vec<u8>),
    Sleep(u64),
}

fn send(s: &str) -> Step {
    Step::Send(s.as_bytes().to_vec())
}

/// Marks the end of a step's answers: a meta get of a key no case uses, whose miss echoes an
/// opaque no case sends (unlike `mn`, which a case may send itself).
const END_ASK: &[u8] = b"mg __end_of_step__ Oz9q\r\n";
const END_ANSWER: &[u8] = b"EN Oz9q\r\n";

/// Sends a case's steps and reads its answers.
fn run_case(addr: SocketAddr, steps: &[Step], closes: bool) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"flush_all\r\n").unwrap();
    let mut answers = Vec::new();
    read_until(&mut s, &mut answers, b"OK\r\n");
    answers.clear();
    let mut last_cas = String::from("0");
    for step in steps {
        match step {
            Step::Sleep(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Step::Send(bytes) => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
                let mut text = String::from_utf8_lossy(bytes).replace("{cas}", &last_cas);
                for (tag, t) in [("{now+100}", now + 100), ("{now-100}", now - 100)] {
                    text = text.replace(tag, &t.to_string());
                }
                let out = if bytes.is_ascii() { text.into_bytes() } else { bytes.clone() };
                s.write_all(&out).unwrap();
                // The answers so far, so that `{cas}` can name what this step's gets returned.
                s.write_all(END_ASK).unwrap();
                let before = answers.len();
                if !read_until(&mut s, &mut answers, END_ANSWER) {
                    return answers; // closed
                }
                answers.truncate(answers.len() - END_ANSWER.len());
                if let Some(c) = cas_of(&answers[before..]).pop() {
                    last_cas = c;
                }
            }
        }
    }
    if closes {
        let _ = s.read_to_end(&mut answers);
    }
    answers
}

/// Reads until the answers end with `end`; `false` if the connection closed first.
fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, end: &[u8]) -> bool {
    let mut chunk = [0u8; 65536];
    while !buf.ends_with(end) {
        match s.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return false,
            Err(e) => panic!("reading answers: {e}; so far {:?}", String::from_utf8_lossy(buf)),
        }
    }
    true
}

/// The cas uniques in answers, in order: of `VALUE` lines (gets, gats) and the `c` flags of
/// meta answers.
fn cas_of(answers: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(answers);
    let mut found = Vec::new();
    for l in text.split("\r\n") {
        let w: Vec<&str> = l.split(' ').collect();
        if w.len() == 5 && w[0] == "VALUE" {
            found.push(w[4].to_string());
        } else if is_meta(w[0]) {
            found.extend(w[1..].iter().filter_map(|t| meta_cas(t)).map(str::to_string));
        }
    }
    found
}

fn is_meta(code: &str) -> bool {
    matches!(code, "HD" | "VA" | "EN" | "NF" | "NS" | "EX")
}

/// The number of a meta `c<number>` flag.
fn meta_cas(token: &str) -> Option<&str> {
    token.strip_prefix('c').filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The answers with each cas unique replaced by the order in which it first appeared, and
/// `stats`/`version` answers by their shape.
fn normalize(answers: &[u8]) -> String {
    let text = String::from_utf8_lossy(answers).into_owned();
    let mut seen: Vec<String> = Vec::new();
    let mut out = String::new();
    let mut in_stats = false;
    for line in text.split_inclusive("\r\n") {
        if line.starts_with("STAT ") {
            if !in_stats {
                out.push_str("<stats>\r\n");
            }
            in_stats = true;
            continue;
        }
        in_stats = false;
        if line.starts_with("VERSION ") {
            out.push_str("VERSION <v>\r\n");
            continue;
        }
        let mut index = |cas: &str| {
            let i = seen.iter().position(|c| c == cas).unwrap_or_else(|| {
                seen.push(cas.to_string());
                seen.len() - 1
            });
            format!("<cas{i}>")
        };
        let w: Vec<&str> = line.trim_end_matches("\r\n").split(' ').collect();
        if w.len() == 5 && w[0] == "VALUE" {
            out.push_str(&format!("VALUE {} {} {} {}\r\n", w[1], w[2], w[3], index(w[4])));
            continue;
        }
        if is_meta(w[0]) && line.ends_with("\r\n") {
            let t: Vec<String> =
                w.iter().map(|t| meta_cas(t).map_or(t.to_string(), |n| format!("c{}", index(n)))).collect();
            out.push_str(&t.join(" "));
            out.push_str("\r\n");
            continue;
        }
        if w[0].starts_with("key=") {
            // lru_crawler metadump: last access, cas and item size are each server's own.
            for item in line.split_inclusive('\n') {
                let t: Vec<&str> = item
                    .trim_end()
                    .split(' ')
                    .map(|t| match t.split_once('=') {
                        Some(("la" | "cas" | "size", _)) => "<internal>",
                        _ => t,
                    })
                    .collect();
                out.push_str(&t.join(" "));
                out.push_str(if item.ends_with("\r\n") { "\r\n" } else { "\n" });
            }
            continue;
        }
        if w[0] == "ME" && w.len() == 8 {
            // Slab class and item size are memcached's own; the rest must agree.
            let cas = w[4].strip_prefix("cas=").map_or("?".to_string(), &mut index);
            out.push_str(&format!("ME {} {} {} cas={cas} {} <internals>\r\n", w[1], w[2], w[3], w[5]));
            continue;
        }
        out.push_str(line);
    }
    out
}

/// The corpus: every command and flag of the text protocol, edge cases included.
fn corpus() -> Vec<(&'static str, Vec<Step>, bool)> {
    let k250 = "k".repeat(250);
    let k251 = "k".repeat(251);
    let many: String = (0..120).map(|i| format!("set m{i} {i} 0 {}\r\n{i}\r\n", i.to_string().len())).collect();
    let many_get: String = (0..130).map(|i| format!(" m{i}")).collect();
    let big = format!("set big 0 0 {}\r\n{}\r\nget big\r\n", 2 << 20, "b".repeat(2 << 20));
    let long_line = format!("set {}\r\n", "x".repeat(3000));
    // memcached drops a key whose set is refused as too large (so that its old value is not
    // taken for the new one); add, replace and append keep it. Every meta set drops it.
    let n = 2 << 20;
    let refused_sets: String = ["add", "replace", "append", "prepend", "cas", "set"]
        .iter()
        .map(|cmd| {
            let cas = if *cmd == "cas" { " 1" } else { "" };
            format!("{cmd} t 0 0 {n}{cas}\r\n{}\r\nget t\r\n", "t".repeat(n))
        })
        .collect();
    let refused_ms: String = ["S", "E", "R", "A", "P"]
        .iter()
        .map(|m| format!("set u 0 0 1\r\na\r\nms u {n} M{m}\r\n{}\r\nmg u v\r\n", "u".repeat(n)))
        .collect();
    vec![
        ("a set refused as too large drops the key", vec![send(&format!("set t 0 0 1\r\na\r\n{refused_sets}"))], false),
        ("a meta set refused as too large drops the key, whatever its mode", vec![send(&refused_ms)], false),
        ("set and get", vec![send("set a 0 0 1\r\nx\r\nget a\r\nget b\r\n")], false),
        (
            "flags at the edges",
            vec![send(
                "set a 4294967295 0 1\r\nx\r\nget a\r\nset a 4294967296 0 1\r\ny\r\nget a\r\nset a -1 0 1\r\nz\r\nget a\r\nset a +7 0 1\r\nz\r\nget a\r\n",
            )],
            false,
        ),
        ("multi-get with repeats", vec![send("set a 0 0 1\r\n1\r\nset b 3 0 2\r\n22\r\nget a b c a\r\n")], false),
        (
            "gets and cas",
            vec![
                send("set a 0 0 1\r\n1\r\ngets a\r\n"),
                send("cas a 5 0 1 {cas}\r\n2\r\n"),
                send("cas a 0 0 1 {cas}\r\n3\r\ngets a\r\n"),
                send("cas nope 0 0 1 1\r\nx\r\ncas a 0 0 1 abc\r\nx\r\ncas a 0 0 1\r\n"),
                send("cas a 0 0 1 {cas} noreply\r\n4\r\nget a\r\n"),
            ],
            false,
        ),
        (
            "touch keeps the cas unique, a write changes it",
            vec![
                send("set a 0 0 1\r\nx\r\ngets a\r\ntouch a 100\r\ngets a\r\n"),
                send("cas a 0 0 1 {cas}\r\ny\r\ngets a\r\nincr a 1\r\n"),
                send("set n 0 0 1\r\n1\r\ngets n\r\nincr n 1\r\ncas n 0 0 1 {cas}\r\n5\r\nget n\r\n"),
            ],
            false,
        ),
        (
            "add and replace",
            vec![send(
                "add a 1 0 1\r\n1\r\nadd a 2 0 1\r\n2\r\nreplace b 0 0 1\r\n1\r\nreplace a 3 0 1\r\n3\r\nget a b\r\n",
            )],
            false,
        ),
        (
            "append and prepend keep flags",
            vec![send(
                "append a 0 0 1\r\nx\r\nprepend a 0 0 1\r\nx\r\nset a 7 0 2\r\nmm\r\nappend a 9 0 2\r\nzz\r\nprepend a 9 0 2\r\naa\r\nget a\r\n",
            )],
            false,
        ),
        (
            "incr and decr",
            vec![send(concat!(
                "incr a 1\r\ndecr a 1\r\nset a 0 0 2\r\n10\r\nincr a 5\r\ndecr a 100\r\nget a\r\n",
                "set a 0 0 3\r\n100\r\ndecr a 1\r\nget a\r\nincr a 1\r\nget a\r\n",
                "set b 0 0 3\r\nabc\r\nincr b 1\r\nincr a -1\r\nincr a abc\r\nincr a 18446744073709551616\r\n",
                "set c 0 0 20\r\n18446744073709551615\r\nincr c 1\r\nget c\r\ndecr c 5\r\nget c\r\n",
                "set d 0 0 0\r\n\r\nincr d 1\r\nset e 2 0 3\r\n 12\r\nincr e 1\r\nget e\r\n",
                "set f 0 0 5\r\n12 34\r\nincr f 1\r\nget f\r\nset g 0 0 2\r\n-1\r\nincr g 1\r\n",
                "set h 0 0 2\r\n99\r\nincr h 1\r\nget h\r\nincr\r\nincr a\r\nincr a 1 2 3\r\n",
            ))],
            false,
        ),
        (
            "delete and its forms",
            vec![send(
                "delete a\r\nset a 0 0 1\r\nx\r\ndelete a 0\r\nset a 0 0 1\r\nx\r\ndelete a 0 noreply\r\nget a\r\nset a 0 0 1\r\nx\r\ndelete a 5\r\ndelete a noreply\r\nget a\r\ndelete\r\ndelete a 0 noreply extra\r\n",
            )],
            false,
        ),
        (
            "touch, gat and gats",
            vec![send(
                "touch a 10\r\nset a 4 0 1\r\nx\r\ntouch a 10\r\ntouch a abc\r\ntouch a\r\ngat 100 a b\r\ngats 100 a\r\ngat abc a\r\ngat 100\r\ngat\r\n",
            )],
            false,
        ),
        (
            "expiry: relative, negative, absolute, touched away",
            vec![
                send(concat!(
                    "set a 0 1 1\r\nx\r\nset b 0 -1 1\r\ny\r\nget a b\r\n",
                    "set c 0 {now+100} 1\r\nz\r\nget c\r\nset d 0 {now-100} 1\r\nz\r\nget d\r\n",
                    "set e 0 0 1\r\nx\r\ntouch e -1\r\nget e\r\nset f 0 0 1\r\nx\r\ngat -1 f\r\nget f\r\n",
                    "set g 0 100 1\r\nx\r\nset g 0 -1 1\r\ny\r\nget g\r\n",
                )),
                Step::Sleep(2100),
                send("get a c\r\n"),
            ],
            false,
        ),
        (
            "noreply on every command that takes it",
            vec![send(concat!(
                "set a 0 0 1 noreply\r\n1\r\nadd a 0 0 1 noreply\r\n2\r\nreplace a 0 0 1 noreply\r\n3\r\n",
                "append a 0 0 1 noreply\r\n4\r\nprepend a 0 0 1 noreply\r\n5\r\nget a\r\n",
                "set n 0 0 1\r\n5\r\nincr n 1 noreply\r\ndecr n 2 noreply\r\nincr a 1 noreply\r\nget n\r\n",
                "touch n 0 noreply\r\ndelete n noreply\r\nget n\r\nflush_all noreply\r\nget a\r\n",
                "set a 0 0 abc noreply\r\nverbosity 1 noreply\r\nadd a 0 0 1 noreply\r\n1\r\nadd a 0 0 1 noreply\r\n2\r\nget a\r\n",
            ))],
            false,
        ),
        (
            "flush_all and its forms",
            vec![send(concat!(
                "set a 0 0 1\r\nx\r\nflush_all\r\nget a\r\nset a 0 0 1\r\ny\r\nget a\r\n",
                "flush_all 0\r\nflush_all -1\r\nflush_all abc\r\nflush_all 1 2\r\nflush_all 1 noreply extra\r\nget a\r\nflush_all 0 noreply\r\n",
            ))],
            false,
        ),
        (
            "a delayed flush_all",
            vec![send("set a 0 0 1\r\nx\r\nflush_all 2\r\nget a\r\n"), Step::Sleep(3100), send("get a\r\n")],
            false,
        ),
        (
            "version, verbosity, stats, mn",
            vec![send(
                "version\r\nverbosity 1\r\nverbosity\r\nverbosity noreply\r\nverbosity 1 noreply\r\nverbosity abc\r\nverbosity 1 2\r\nstats\r\nstats settings\r\nstats detail\r\nstats reset\r\nstats bogus\r\nmn\r\n",
            )],
            false,
        ),
        (
            "unknown commands and malformed lines",
            vec![send(concat!(
                "\r\nx\r\nGET a\r\nget\r\nbogus a b c\r\nset a 0 0\r\nset a 0 0 1 2 3\r\n",
                "set a 0 0 -1\r\nset a 0 0 abc\r\nset a abc 0 1\r\nx\r\nset a 0 abc 1\r\nx\r\n",
                "   get    a   \r\nset  b  0  0  1 \r\nq\r\nget b\r\nget a\n",
            ))],
            false,
        ),
        (
            "keys at the length limit",
            ["set {k} 0 0 1\r\nx\r\nget {k}\r\n", "get {K}\r\n", "set {K} 0 0 1\r\nx\r\n", "delete {K}\r\n", "incr {K} 1\r\n", "touch {K} 1\r\n", "get a {K} b\r\n"]
                .iter()
                .map(|s| Step::Send(s.replace("{k}", &k250).replace("{K}", &k251).into_bytes()))
                .collect(),
            false,
        ),
        (
            "a data block longer or shorter than declared",
            vec![send("set a 0 0 1\r\nxyz\r\nget a\r\n"), send("set a 0 0 5\r\nab\r\nget a\r\nget a\r\n")],
            false,
        ),
        (
            "a value larger than the largest item is refused and read past",
            vec![Step::Send(big.into_bytes()), send("set a 0 0 1\r\nx\r\nget a\r\n")],
            false,
        ),
        ("a pipeline of 120 sets and a get of 130 keys", vec![Step::Send(format!("{many}get{many_get}\r\n").into_bytes())], false),
        (
            "meta: mg and ms, values and flags",
            vec![send(concat!(
                "ms a 2\r\nhi\r\nmg a v\r\nmg a s v f t\r\nmg b v\r\nmg b v q\r\nmg b k O123\r\nmg a k v O123 s\r\n",
                "ms a 2 F5 T100\r\nhi\r\nmg a f t s\r\nms a 2 T-1\r\nhi\r\nmg a v\r\nms e 0\r\n\r\nmg e v s\r\n",
                "ms a 2 q\r\nhi\r\nms a 2 q O9 k\r\nhi\r\nmg a\r\nmg a q\r\nget a\r\n",
            ))],
            false,
        ),
        (
            "meta: ms modes and cas",
            vec![
                send(concat!(
                    "ms a 1 ME\r\n1\r\nms a 1 ME\r\n2\r\nms b 1 MR\r\n1\r\nms a 1 MR\r\n3\r\n",
                    "ms a 1 MA\r\nx\r\nms a 1 MP\r\ny\r\nms c 1 MA\r\nz\r\nms c 1 MP\r\nz\r\nmg a v\r\n",
                    "ms a 1 MX\r\nq\r\nms a 1 Mxx\r\nq\r\nms a 1 MS F3\r\nw\r\nmg a v f\r\n",
                )),
                send("ms k 1 c\r\n1\r\n"),
                send("ms k 1 C{cas}\r\n2\r\nms k 1 C{cas} c\r\n3\r\nms nope 1 C1\r\nx\r\nmg k v\r\n"),
                send("ms k 1 c\r\n4\r\n"),
                send("ms k 1 MA C{cas}\r\n5\r\nms k 1 MA C1\r\n6\r\nms k 1 ME C1\r\n7\r\nms k 1 MR C{cas}\r\n8\r\nmg k v\r\n"),
            ],
            false,
        ),
        (
            "meta: md and ma",
            vec![
                send(concat!(
                    "ms a 1\r\n1\r\nmd a\r\nmd a\r\nmd a q\r\nms a 1\r\n1\r\nmd a q O5 k\r\nmg a v\r\n",
                    "ms a 1\r\n1\r\nmd a C1\r\nmd a O77 k\r\nmd a zz\r\nmd a q q\r\n",
                    "ma n\r\nma n q\r\nma n N0 J5\r\nma n\r\nma n v\r\nma n MD D3 v\r\nma n M- D100 v\r\n",
                    "ma n MI D2 v t\r\nma n M+ q\r\nmg n v\r\nms x 3\r\nabc\r\nma x\r\nma n Mz\r\nma n D-1\r\nma n J\r\n",
                    "ma n O1 k\r\nma zz O1 k\r\nma n C1\r\nma new N100 J7 v t\r\n",
                )),
                send("ms m 2 c\r\n10\r\n"),
                send("ma m C{cas} v\r\nma m C{cas} v\r\nmd m C{cas}\r\n"),
            ],
            false,
        ),
        (
            "meta: stale-while-revalidate, win tokens, vivify, recache",
            vec![
                send("ms a 2 T100 c\r\nhi\r\n"),
                send("md a I T30\r\nmg a v t\r\nmg a v\r\nmg a s\r\n"),
                send("ms a 3 C{cas} I\r\nold\r\nmg a v\r\nmg a c\r\n"),
                send("ms a 3 C{cas} I\r\nnew\r\nmg a v\r\n"),
                send("mg v N30 v t\r\nmg v N30 v\r\nmg v v c\r\n"),
                send("ms v 1 C{cas}\r\nx\r\nmg v v\r\n"),
                send("ms r 1 T10\r\nx\r\nmg r R30 v\r\nmg r R30 v\r\nmg r R5 v\r\nms s 1 T100\r\nx\r\nmg s R30 v\r\n"),
                send("ms t 1\r\nx\r\nmg t T100 t\r\nmg t t\r\nmg t T-1 v\r\nmg t v\r\n"),
            ],
            false,
        ),
        (
            "meta: fetched, last access, me, base64 keys",
            vec![send(concat!(
                "ms a 1\r\nx\r\nmg a h l\r\nmg a h l\r\nms b 1\r\nx\r\nmg b u h\r\nmg b h\r\nms c 1\r\nx\r\nget c\r\nmg c h\r\n",
                "ms d 1 T100\r\nx\r\nme d\r\nmg d v\r\nme d\r\nme nope\r\nme\r\n",
                "ms Zm9v 3 b\r\nbar\r\nmg Zm9v b v k\r\nget foo\r\nmg !!! b v\r\nme Zm9v b\r\nmd Zm9v b k\r\nget foo\r\n",
            ))],
            false,
        ),
        (
            "meta: malformed commands",
            vec![send(concat!(
                "mg\r\nmx a\r\nmgg a\r\nmg a zz\r\nmg a v v\r\nmg a O1234567890123456789012345678901234\r\n",
                "ms a\r\nms a x\r\nms a -1\r\nms a 1 Q\r\nx\r\nms a 1 T\r\nx\r\nms a 1 F-1\r\nx\r\n",
                "mg a s s s s s s s s s s s s s s s s s s\r\nmg a v\r\nms a 2\r\nabcd\r\nmg a v\r\n",
                "ms a 1 O1234567890123456789012345678901234\r\nx\r\nmd\r\nma\r\nma a MI MD\r\n",
            ))],
            false,
        ),
        ("quit closes the connection", vec![send("set a 0 0 1\r\nx\r\nget a\r\nquit\r\nget a\r\n")], true),
        ("a command line too long closes the connection", vec![Step::Send(long_line.into_bytes())], true),
        ("an HTTP request closes the connection", vec![send("GET / HTTP/1.1\r\n")], true),
    ]
}

#[test]
fn the_text_protocol_answers_as_memcached_does() {
    let memcached = Memcached::start();
    // memcached's largest item is 1 MiB by default; larder is given the same limit here.
    let larder =
        Server::start(&["--memcache-listen", "127.0.0.1:0", "--max-value-size", "1MiB", "--memory-capacity", "16MiB"]);
    let ours = larder.memcache.expect("memcached address");
    let mut diffs = Vec::new();
    for (name, steps, closes) in corpus() {
        // Both at once: the cases that wait for an expiry wait once.
        let (theirs, mine) = std::thread::scope(|s| {
            let theirs = s.spawn(|| normalize(&run_case(memcached.addr, &steps, closes)));
            let mine = normalize(&run_case(ours, &steps, closes));
            (theirs.join().unwrap(), mine)
        });
        if theirs != mine {
            diffs.push(format!("--- {name}\nmemcached:\n{theirs}\nlarder:\n{mine}"));
        }
    }
    assert!(diffs.is_empty(), "{} of the corpus's cases differ:\n{}", diffs.len(), diffs.join("\n"));
}

/// memcached's operator commands, compared with memcached started without the features larder
/// does not have (no slab reassignment; no LRU maintainer, so one flat LRU as larder's one
/// class): the key dumps memcdump and monitoring tools use, the statistics groups (by shape),
/// and the commands larder answers as memcached does with the feature off. `watch` turns a
/// connection into a stream that never ends: memcached's own `watcher_connid.t`
/// (tests/memcached_suite.rs) and `memcache::a_watcher_…` test it.
/// `cache_memlimit N` is the documented difference (larder's memory tier is sized at start).
#[test]
fn the_operator_commands_answer_as_memcached_with_those_features_off_does() {
    let memcached = Memcached::start_with(&["-o", "no_slab_reassign,no_lru_maintainer"]);
    let larder = Server::start(&["--memcache-listen", "127.0.0.1:0", "--memory-capacity", "16MiB"]);
    let steps = [
        "stats items\r\nstats slabs\r\nstats sizes\r\nstats conns\r\n",
        "stats cachedump 1 0\r\nstats cachedump 1 1\r\nstats cachedump 5 0\r\nstats cachedump 63 0\r\nstats cachedump 64 0\r\nstats cachedump 199 0\r\n",
        "stats cachedump 1\r\nstats cachedump\r\nstats cachedump -1 0\r\nstats cachedump a 0\r\nstats cachedump 1 -1\r\n",
        "stats detail on\r\nstats detail dump\r\nstats detail off\r\nstats detail\r\nstats detail xx\r\n",
        // memcached takes a metadump only first in what it has read, and a crawl while none
        // runs (else BUSY): one per step.
        "lru_crawler metadump all\r\n",
        "lru_crawler metadump 1\r\n",
        "lru_crawler metadump 5\r\n",
        "lru_crawler metadump 100\r\n",
        "lru_crawler metadump\r\n",
        "lru_crawler crawl all\r\n",
        "lru_crawler sleep 100\r\nlru_crawler sleep 2000000\r\nlru_crawler sleep x\r\n",
        "lru_crawler tocrawl 10\r\nlru_crawler tocrawl x\r\nlru_crawler enable\r\nlru_crawler\r\nlru_crawler foo\r\nlru_crawler mgdump all\r\n",
        "slabs automove 1\r\nslabs automove 0\r\nslabs automove 3\r\nslabs automove x\r\nslabs automove\r\nslabs\r\n",
        "slabs automove 1 noreply\r\nlru tune 10 20 0.1 2 noreply\r\nslabs reassign 1 2 noreply\r\nshutdown noreply\r\n",
        "slabs reassign 1 2\r\nslabs reassign 1 1\r\nslabs reassign 1\r\nlru mode flat\r\nlru temp_ttl 10\r\nlru tune 10 20 0.1 2\r\nlru\r\n",
        "shutdown\r\nshutdown graceful\r\ncache_memlimit\r\nmisbehave\r\ndebugtime\r\nextstore\r\nextstore x\r\n",
    ];
    let ours = larder.memcache.expect("memcached address");
    let mut diffs = Vec::new();
    for text in steps {
        // After the case's flush_all, one item (memcached's dumps list flushed items too).
        // A key with each of the characters metadump leaves unencoded, and one it encodes.
        let case = [send("set op-a.b_c~d:e 0 0 3\r\nabc\r\n"), send(text)];
        let theirs = normalize(&run_case(memcached.addr, &case, false));
        let mine = normalize(&run_case(ours, &case, false));
        if theirs != mine {
            diffs.push(format!("--- {text:?}\nmemcached:\n{theirs}\nlarder:\n{mine}"));
        }
    }
    assert!(diffs.is_empty(), "{} steps differ:\n{}", diffs.len(), diffs.join("\n"));
}

/// The text login as memcached does it with `-Y` (an authfile of `user:password` lines) and
/// larder with `--auth-token`: one step at a time, each read to its end before the next goes.
#[test]
fn the_text_login_answers_as_memcached_with_an_authfile_does() {
    const TOKEN: &str = "d1ff-t0ken";
    let tmp = tempfile::tempdir().unwrap();
    let authfile = tmp.path().join("authfile");
    std::fs::write(&authfile, format!("larder:{TOKEN}\n")).unwrap();
    // memcached reads it as the user it runs as.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&authfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let memcached = Memcached::start_with(&["-Y", authfile.to_str().unwrap()]);
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let larder = Server::start(&["--memcache-listen", "127.0.0.1:0", "--auth-token", token_file.to_str().unwrap()]);
    let login = |data: &str| format!("set x 0 0 {}\r\n{data}\r\n", data.len());
    let cases: Vec<(&str, Vec<(String, &str)>)> = vec![
        (
            "anonymous commands",
            ["get a", "gets a b", "delete a", "incr a 1", "touch a 1", "flush_all", "mg a v", "md a", "ma a", "stats"]
                .iter()
                .map(|l| (format!("{l}\r\n"), "\r\n"))
                .collect(),
        ),
        ("a credential of one word", vec![(login("hello"), "\r\n"), ("get x\r\n".into(), "\r\n")]),
        ("a wrong password", vec![(login("larder nope"), "\r\n"), ("get x\r\n".into(), "\r\n")]),
        ("add is not a login", vec![(format!("add x 0 0 {}\r\nlarder {TOKEN}\r\n", TOKEN.len() + 7), "\r\n")]),
        (
            "a login, then everything",
            vec![
                (login(&format!("larder {TOKEN}")), "\r\n"),
                ("set a 0 0 2\r\nhi\r\n".into(), "\r\n"),
                ("get a x\r\n".into(), "END\r\n"),
                ("delete a\r\n".into(), "\r\n"),
                ("mn\r\n".into(), "\r\n"),
            ],
        ),
        (
            "spaces and a word more",
            vec![(login(&format!("larder  {TOKEN} more")), "\r\n"), ("get a\r\n".into(), "END\r\n")],
        ),
        (
            "a wrong password, then the right one",
            vec![
                (login("larder nope"), "\r\n"),
                (login(&format!("larder {TOKEN}")), "\r\n"),
                ("get a\r\n".into(), "END\r\n"),
            ],
        ),
    ];
    let run = |addr: SocketAddr, steps: &[(String, &str)]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        for (bytes, end) in steps {
            s.write_all(bytes.as_bytes()).unwrap();
            let mut answer = Vec::new();
            read_until(&mut s, &mut answer, end.as_bytes());
            out.push(String::from_utf8_lossy(&answer).into_owned());
        }
        out
    };
    let mut diffs = Vec::new();
    for (name, steps) in &cases {
        let (theirs, mine) = (run(memcached.addr, steps), run(larder.memcache.unwrap(), steps));
        if theirs != mine {
            diffs.push(format!("--- {name}\nmemcached: {theirs:?}\nlarder:    {mine:?}"));
        }
    }
    assert!(diffs.is_empty(), "{} of {} cases differ:\n{}", diffs.len(), cases.len(), diffs.join("\n"));
}

/// A binary request of a case: opcode, extras, key, value, cas.
type Request = (u8, Vec<u8>, &'static [u8], &'static [u8], u64);

/// A binary request: opcode, extras, key, value, cas; the opaque is the request's number.
fn packet(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64, opaque: u32) -> Vec<u8> {
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.push(extras.len() as u8);
    p.extend_from_slice(&[0, 0, 0]);
    p.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    p.extend_from_slice(&opaque.to_be_bytes());
    p.extend_from_slice(&cas.to_be_bytes());
    p.extend_from_slice(extras);
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}

/// Sends a binary case (then a noop) and returns its answers, one line per packet with its
/// cas replaced by the order in which it first appeared (0 stays 0), and the version's text
/// by a placeholder.
fn run_binary(addr: SocketAddr, requests: &[Request], closes: bool) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = packet(0x08, &[], b"", b"", 0, 0); // flush
    for (i, (op, extras, key, value, cas)) in requests.iter().enumerate() {
        all.extend(packet(*op, extras, key, value, *cas, i as u32 + 1));
    }
    if !closes {
        all.extend(packet(0x0a, &[], b"", b"", 0, u32::MAX));
    }
    s.write_all(&all).unwrap();
    let mut got = Vec::new();
    let mut seen: Vec<u64> = Vec::new();
    let mut lines = Vec::new();
    loop {
        while got.len() >= 24 {
            let body = u32::from_be_bytes(got[8..12].try_into().unwrap()) as usize;
            if got.len() < 24 + body {
                break;
            }
            let p: Vec<u8> = got.drain(..24 + body).collect();
            let opaque = u32::from_be_bytes(p[12..16].try_into().unwrap());
            if opaque == u32::MAX {
                return lines.join("\n");
            }
            let cas = u64::from_be_bytes(p[16..24].try_into().unwrap());
            let cas = if cas == 0 {
                "0".to_string()
            } else {
                let i = seen.iter().position(|&c| c == cas).unwrap_or_else(|| {
                    seen.push(cas);
                    seen.len() - 1
                });
                format!("<cas{i}>")
            };
            let (key_len, extras) = (u16::from_be_bytes([p[2], p[3]]) as usize, p[4] as usize);
            let status = u16::from_be_bytes([p[6], p[7]]);
            let mut body = String::from_utf8_lossy(&p[24..]).into_owned();
            if p[1] == 0x0b {
                body = "<version>".into();
            }
            lines.push(format!(
                "op {:#04x} #{opaque} status {status:#06x} extras {extras} key {key_len} cas {cas} body {body:?}",
                p[1]
            ));
        }
        let mut buf = [0u8; 65536];
        match s.read(&mut buf) {
            Ok(0) | Err(_) => {
                lines.push("<closed>".into());
                return lines.join("\n");
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn the_binary_protocol_answers_as_memcached_does() {
    let memcached = Memcached::start();
    let larder = Server::start(&["--memcache-listen", "127.0.0.1:0", "--max-value-size", "1MiB"]);
    let ours = larder.memcache.expect("memcached address");
    let set = |flags: u32, exp: u32| [flags.to_be_bytes(), exp.to_be_bytes()].concat();
    let delta =
        |d: u64, initial: u64, exp: u32| [&d.to_be_bytes()[..], &initial.to_be_bytes(), &exp.to_be_bytes()].concat();
    let none = Vec::new();
    let too_large: &'static [u8] = Box::leak(vec![b'l'; 2 << 20].into_boxed_slice());
    let requests: Vec<Request> = vec![
        (0x01, set(5, 0), b"a", b"hi", 0),
        (0x00, none.clone(), b"a", b"", 0),
        (0x0c, none.clone(), b"a", b"", 0),
        (0x00, none.clone(), b"missing", b"", 0),
        (0x0c, none.clone(), b"missing", b"", 0),
        (0x09, none.clone(), b"missing", b"", 0),
        (0x0d, none.clone(), b"a", b"", 0),
        (0x02, set(0, 0), b"a", b"x", 0),
        (0x02, set(0, 0), b"b", b"bee", 0),
        (0x03, set(0, 0), b"c", b"x", 0),
        (0x03, set(7, 0), b"b", b"bb", 0),
        (0x0e, none.clone(), b"a", b"!", 0),
        (0x0f, none.clone(), b"a", b"<", 0),
        (0x0e, none.clone(), b"nope", b"!", 0),
        (0x00, none.clone(), b"a", b"", 0),
        (0x01, set(0, 0), b"a", b"z", 12345),
        (0x01, set(0, 0), b"nope", b"z", 12345),
        (0x04, none.clone(), b"a", b"", 0),
        (0x04, none.clone(), b"a", b"", 0),
        (0x05, delta(5, 10, 0), b"n", b"", 0),
        (0x05, delta(5, 10, 0), b"n", b"", 0),
        (0x06, delta(20, 0, 0), b"n", b"", 0),
        (0x05, delta(1, 0, u32::MAX), b"nothing", b"", 0),
        (0x05, delta(1, 0, 0), b"b", b"", 0),
        (0x11, set(0, 0), b"q", b"quiet", 0),
        (0x12, set(0, 0), b"q", b"again", 0),
        (0x13, set(0, 0), b"nope", b"x", 0),
        (0x14, none.clone(), b"nope", b"", 0),
        (0x15, delta(1, 0, 0), b"n", b"", 0),
        (0x00, none.clone(), b"q", b"", 0),
        (0x1c, 100u32.to_be_bytes().to_vec(), b"b", b"", 0),
        (0x1c, 100u32.to_be_bytes().to_vec(), b"nope", b"", 0),
        (0x1d, 100u32.to_be_bytes().to_vec(), b"b", b"", 0),
        (0x23, 100u32.to_be_bytes().to_vec(), b"b", b"", 0),
        (0x1e, 100u32.to_be_bytes().to_vec(), b"nope", b"", 0),
        (0x01, set(0, 0xffff_ffff), b"expired", b"x", 0),
        (0x00, none.clone(), b"expired", b"", 0),
        (0x0b, none.clone(), b"", b"", 0),
        (0x0a, none.clone(), b"", b"", 0),
        (0x08, none.clone(), b"", b"", 0),
        (0x00, none.clone(), b"b", b"", 0),
        // A set refused as too large drops the key (memcached's rule); add and replace keep it.
        (0x01, set(0, 0), b"tl", b"a", 0),
        (0x02, set(0, 0), b"tl", too_large, 0),
        (0x03, set(0, 0), b"tl", too_large, 0),
        (0x00, none.clone(), b"tl", b"", 0),
        (0x01, set(0, 0), b"tl", too_large, 0),
        (0x00, none.clone(), b"tl", b"", 0),
        (0x01, set(0, 0), b"tl", b"a", 0),
        (0x11, set(0, 0), b"tl", too_large, 0),
        (0x00, none.clone(), b"tl", b"", 0),
    ];
    // An opcode neither knows.
    let unknown: Vec<Request> = vec![(0x30, none.clone(), b"", b"", 0)];
    // A request whose extras do not fit its command is answered "Invalid arguments", and
    // the connection closed.
    let invalid: Vec<Request> =
        vec![(0x01, set(1, 0), b"ok", b"1", 0), (0x00, set(0, 0), b"a", b"", 0), (0x00, none.clone(), b"ok", b"", 0)];
    let invalid_set: Vec<Request> = vec![(0x01, none.clone(), b"a", b"x", 0)];
    let cases = [(requests, false), (unknown, false), (invalid, true), (invalid_set, true)];
    let theirs: Vec<String> = cases.iter().map(|(r, closes)| run_binary(memcached.addr, r, *closes)).collect();
    let mine: Vec<String> = cases.iter().map(|(r, closes)| run_binary(ours, r, *closes)).collect();
    let (theirs, mine) = (theirs.join("\n--\n"), mine.join("\n--\n"));
    if theirs != mine {
        let diff: Vec<String> = theirs
            .lines()
            .zip(mine.lines())
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("memcached: {a}\nlarder:    {b}"))
            .collect();
        panic!(
            "binary answers differ ({} vs {} packets):\n{}",
            theirs.lines().count(),
            mine.lines().count(),
            diff.join("\n")
        );
    }
}
