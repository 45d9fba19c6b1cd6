//! Ring awareness: which node of a cluster a router sends a key to, computed as the router
//! computes it, so that a node can tell the keys it owns from the ones it is only given while
//! their owner is away (docs/CLUSTER.md). Pure, no I/O.
//!
//! Two placements: nginx's `hash $request_uri consistent` (the HTTP router of
//! deploy/nginx/larder-cluster.conf, and the Python client), and ketama as twemproxy and
//! libmemcached compute it (memcached routers), with MD5 or twemproxy's FNV-1a key hash.

use md5::{Digest, Md5};
use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Bytes that keep their form in a canonical key path: RFC 3986 "unreserved" and `/`.
pub const KEY_ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');

/// The router's placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// nginx `hash $request_uri consistent`: the key is routed by its canonical path.
    Nginx,
    /// ketama (twemproxy `distribution: ketama`, libmemcached's weighted ketama) over the
    /// memcached key, hashed with MD5 (twemproxy `hash: md5`, libmemcached's default).
    KetamaMd5,
    /// ketama over the memcached key hashed with twemproxy's `fnv1a_64` (its default hash).
    KetamaFnv1a64,
}

impl Placement {
    /// Every placement, with the name flags and the config file use.
    pub const ALL: [(Placement, &'static str); 3] =
        [(Placement::Nginx, "nginx"), (Placement::KetamaMd5, "ketama"), (Placement::KetamaFnv1a64, "ketama-fnv1a_64")];

    /// The name flags use.
    pub fn name(self) -> &'static str {
        Placement::ALL.iter().find(|(p, _)| *p == self).map_or("", |(_, n)| n)
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Placement, String> {
        Placement::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(p, _)| *p)
            .ok_or_else(|| format!("unknown cluster hash {s:?}: use nginx, ketama (MD5 keys) or ketama-fnv1a_64"))
    }
}

/// A node as the router's configuration names it: its server string exactly as written
/// there (e.g. `127.0.0.1:8001`; `localhost:8001` is another node) and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The server string.
    pub name: String,
    /// The weight (1 unless given).
    pub weight: u32,
}

/// Parses a node list: comma-separated server strings, each with an optional `=WEIGHT`.
pub fn parse_nodes(list: &str) -> Result<Vec<Node>, String> {
    let mut nodes: Vec<Node> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, weight) = match item.rsplit_once('=') {
            Some((n, w)) => (n, w.parse().ok().filter(|w| (1..=10_000).contains(w))),
            None => (item, Some(1)),
        };
        let weight = weight.ok_or_else(|| format!("node {item:?}: a weight is a whole number from 1 to 10000"))?;
        if name.trim().is_empty() {
            return Err(format!("node {item:?} has no name (host:port, as the router lists it)"));
        }
        if nodes.iter().any(|n| n.name == name) {
            return Err(format!("node {name:?} is listed twice"));
        }
        nodes.push(Node { name: name.to_string(), weight });
    }
    match nodes.len() {
        0 => Err("the cluster's node list is empty".into()),
        n if n > u16::MAX as usize => Err("more than 65535 nodes".into()),
        _ => Ok(nodes),
    }
}

/// A continuum: every node's points, sorted; a key belongs to the node of the first point at
/// or after its hash, wrapping round.
#[derive(Debug, Clone)]
pub struct Ring {
    placement: Placement,
    nodes: Vec<Node>,
    points: Vec<(u32, u16)>,
}

impl Ring {
    /// The ring the router builds from `nodes` with `placement`.
    pub fn new(placement: Placement, nodes: Vec<Node>) -> Ring {
        let mut points = match placement {
            Placement::Nginx => nginx_points(&nodes),
            Placement::KetamaMd5 | Placement::KetamaFnv1a64 => ketama_points(&nodes),
        };
        // nginx keeps one point per hash value; ketama's lookup then finds the first of equal
        // hashes too. Ties between nodes are left to the sort's order (rare: about 1e-5 with
        // a few nodes; docs/CLUSTER.md).
        points.sort_by_key(|&(h, _)| h);
        if placement == Placement::Nginx {
            points.dedup_by_key(|p| p.0);
        }
        Ring { placement, nodes, points }
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The placement.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The share of the hash space `node` owns: the arcs that end at its points (the first
    /// point's arc wraps round from the last), which is the share of keys it owns.
    pub fn share(&self, node: usize) -> f64 {
        let Some(&(last, _)) = self.points.last() else { return 0.0 };
        let mut prev = last;
        let mut owned = 0u64;
        for &(p, n) in &self.points {
            if n as usize == node {
                owned += p.wrapping_sub(prev) as u64;
            }
            prev = p;
        }
        // One point alone owns everything (its arc wraps to itself).
        if self.points.len() == 1 {
            return if self.points[0].1 as usize == node { 1.0 } else { 0.0 };
        }
        owned as f64 / (1u64 << 32) as f64
    }

    /// The index of the node that owns the store key `key` (a memcached key; the path of an
    /// HTTP key without its leading `/`).
    pub fn owner(&self, key: &[u8]) -> usize {
        let h = match self.placement {
            Placement::Nginx => {
                let mut c = crc32fast::Hasher::new();
                c.update(b"/");
                for piece in percent_encode(key, KEY_ENCODE) {
                    c.update(piece.as_bytes());
                }
                c.finalize()
            }
            Placement::KetamaMd5 => md5_point(key, 0),
            Placement::KetamaFnv1a64 => fnv1a_64_twemproxy(key),
        };
        let i = self.points.partition_point(|&(p, _)| p < h);
        self.points.get(i).unwrap_or(&self.points[0]).1 as usize
    }
}

/// nginx's points: 160 per unit of weight; the first is CRC32 of host, NUL, port and 0 as 4
/// little-endian bytes, each next one CRC32 of host, NUL, port and the previous point.
fn nginx_points(nodes: &[Node]) -> Vec<(u32, u16)> {
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let (host, port) = nginx_host_port(&n.name);
        let mut prev = 0u32;
        for _ in 0..160 * n.weight {
            let mut c = crc32fast::Hasher::new();
            c.update(host);
            c.update(b"\0");
            c.update(port);
            c.update(&prev.to_le_bytes());
            prev = c.finalize();
            out.push((prev, i as u16));
        }
    }
    out
}

/// nginx's split of a server string into host and port (docs/CLUSTER.md, "Server strings").
fn nginx_host_port(name: &str) -> (&[u8], &[u8]) {
    let b = name.as_bytes();
    if b.len() >= 5 && b[..5].eq_ignore_ascii_case(b"unix:") {
        return (&b[5..], b"");
    }
    match name.rfind(':') {
        Some(at) if b[at + 1..].iter().all(u8::is_ascii_digit) => (&b[..at], &b[at + 1..]),
        _ => (b, b""),
    }
}

/// ketama's points as twemproxy and libmemcached make them: for a node of `weight` out of a
/// `total`, `floor(weight / total * 40 * nodes) * 4` points (160 for equal weights), four from
/// each MD5 digest of `<name>-<i>`, where the name drops a port of 11211. Made in twemproxy's
/// order of servers (shorter names first, then bytewise), so that the stable sort breaks ties
/// between nodes as it does.
fn ketama_points(nodes: &[Node]) -> Vec<(u32, u16)> {
    let total: u32 = nodes.iter().map(|n| n.weight).sum();
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| (nodes[a].name.len(), &nodes[a].name).cmp(&(nodes[b].name.len(), &nodes[b].name)));
    let mut out = Vec::new();
    for i in order {
        let n = &nodes[i];
        // In single precision at every step, with the epsilon added in double, as twemproxy
        // (nc_ketama.c) and libmemcached compute it: some weights get fewer points than exact
        // arithmetic would give them, and the routers use those.
        let pct = n.weight as f32 / total as f32;
        let x = pct * 160.0 / 4.0 * nodes.len() as f32;
        let per = ((x as f64 + 0.0000000001) as f32).floor() as u32 * 4;
        let name = n.name.strip_suffix(":11211").unwrap_or(&n.name);
        for p in 0..per / 4 {
            let digest = Md5::digest(format!("{name}-{p}").as_bytes());
            for a in 0..4 {
                out.push((le_word(&digest, a), i as u16));
            }
        }
    }
    out
}

fn le_word(digest: &[u8], alignment: usize) -> u32 {
    u32::from_le_bytes(digest[alignment * 4..alignment * 4 + 4].try_into().expect("16-byte digest"))
}

/// A key's ketama hash with MD5: the digest's first four bytes, little-endian.
fn md5_point(key: &[u8], alignment: usize) -> u32 {
    le_word(&Md5::digest(key), alignment)
}

/// twemproxy's `fnv1a_64`: FNV-1a with the 64-bit basis and prime truncated to 32 bits, in
/// 32-bit arithmetic, over the key's bytes as C's signed `char` (a byte of 0x80 or more is
/// sign-extended), as hashkit/nc_fnv.c computes it on x86.
fn fnv1a_64_twemproxy(key: &[u8]) -> u32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 as u32;
    for &b in key {
        h ^= b as i8 as i32 as u32;
        h = h.wrapping_mul(0x0000_0100_0000_01b3u64 as u32);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_parse_with_weights_and_refuse_nonsense() {
        let n = parse_nodes("127.0.0.1:8001, 127.0.0.1:8002=3,unix:/run/l.sock").unwrap();
        assert_eq!(n[1], Node { name: "127.0.0.1:8002".into(), weight: 3 });
        assert_eq!((n[0].weight, n[2].name.as_str()), (1, "unix:/run/l.sock"));
        assert!(parse_nodes("").is_err());
        assert!(parse_nodes("a,a").is_err());
        assert!(parse_nodes("a=0").is_err());
        assert!(parse_nodes("a=x").is_err());
        // A weight with no node before it (issue 39): refused, not a node named "".
        assert!(parse_nodes("=5").unwrap_err().contains("no name"));
        assert!(parse_nodes("a, =2").unwrap_err().contains("no name"));
    }

    #[test]
    fn nginx_host_and_port_split_as_nginx_does() {
        assert_eq!(nginx_host_port("127.0.0.1:8001"), (&b"127.0.0.1"[..], &b"8001"[..]));
        assert_eq!(nginx_host_port("[::1]:8001"), (&b"[::1]"[..], &b"8001"[..]));
        assert_eq!(nginx_host_port("example.org"), (&b"example.org"[..], &b""[..]));
        assert_eq!(nginx_host_port("UNIX:/x:1"), (&b"/x:1"[..], &b""[..]));
    }

    #[test]
    fn every_node_gets_about_its_share() {
        for placement in [Placement::Nginx, Placement::KetamaMd5, Placement::KetamaFnv1a64] {
            let ring = Ring::new(placement, parse_nodes("127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003").unwrap());
            let mut count = [0usize; 3];
            for i in 0..30_000 {
                count[ring.owner(format!("key-{i}").as_bytes())] += 1;
            }
            assert!(count.iter().all(|&c| (7_000..13_000).contains(&c)), "{placement:?}: {count:?}");
            // The share the status page shows is the share of the hash space a node owns: the
            // share of keys, as far as the key hash spreads them evenly. twemproxy's 32-bit
            // FNV-1a spreads keys this alike less evenly than CRC32 or MD5.
            let shares: Vec<f64> = (0..3).map(|n| ring.share(n)).collect();
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{shares:?}");
            let within = if placement == Placement::KetamaFnv1a64 { 0.05 } else { 0.02 };
            for (n, &c) in count.iter().enumerate() {
                let off = (shares[n] - c as f64 / 30_000.0).abs();
                assert!(off < within, "{placement:?}: {shares:?} against {count:?}");
            }
        }
    }

    #[test]
    fn fnv1a_64_is_twemproxys_32_bit_variant() {
        // The empty key is the truncated basis; "a" by hand: (0x84222325 ^ 0x61) * 0x1b3 mod 2^32.
        assert_eq!(fnv1a_64_twemproxy(b""), 0x8422_2325);
        assert_eq!(fnv1a_64_twemproxy(b"a"), (0x8422_2325u32 ^ 0x61).wrapping_mul(0x1b3));
        assert_eq!(fnv1a_64_twemproxy(&[0xe9]), (0x8422_2325u32 ^ 0xffff_ffe9).wrapping_mul(0x1b3));
    }

    #[test]
    fn ketama_points_per_node_follow_the_routers_single_precision() {
        let count = |list: &str| {
            let nodes = parse_nodes(list).unwrap();
            let points = ketama_points(&nodes);
            (0..nodes.len()).map(|i| points.iter().filter(|p| p.1 as usize == i).count()).collect::<Vec<_>>()
        };
        assert_eq!(count("a:1,b:1,c:1"), [160, 160, 160]);
        assert_eq!(count("a:1=1,b:1=2,c:1=3"), [80, 160, 240]);
        // Exact arithmetic would give 32 to the first: float32 gives 28, as the routers do.
        assert_eq!(count("a:1=1,b:1=6,c:1=6,d:1=6,e:1=6")[0], 28);
        let many: Vec<String> = (0..25).map(|i| format!("n{i}:1")).collect();
        assert!(count(&many.join(",")).iter().all(|&c| c == 156));
    }
}
