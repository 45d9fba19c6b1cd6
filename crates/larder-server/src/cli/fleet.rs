//! Commands over a cluster: `larder owner` (which node a key's router places it on) and
//! `larder flush` (one node, or every node: over HTTP for an nginx ring, over memcached's
//! protocol for a ketama ring).

use super::client::{answer, call, fail, Target};
use crate::cluster::Placement;
use crate::config::ClusterArgs;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// `larder owner KEY…`: which node of a cluster owns each key, as its router places it.
#[derive(Args, Debug)]
pub struct OwnerArgs {
    /// The keys (as `larder get` takes them: an HTTP key's path, or a memcached key).
    #[arg(required = true)]
    pub key: Vec<String>,
    /// A server's TOML file to read the cluster_nodes and cluster_hash keys from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `larder flush`: memcached's flush_all for one node (--url), or every node of a cluster.
#[derive(Args, Debug)]
pub struct FlushArgs {
    /// Flush every node of the cluster (--cluster-nodes, or the cluster_nodes key of
    /// --config): over HTTP for an nginx ring, over memcached's protocol for a ketama ring.
    #[arg(long)]
    pub cluster: bool,
    /// A server's TOML file to read the cluster from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub ring: ClusterArgs,
    /// Flush in this many seconds instead of now.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub delay: u64,
    #[command(flatten)]
    pub target: Target,
}

pub fn owner(a: OwnerArgs) -> i32 {
    let ring = match a.cluster.resolve(a.config.as_ref()) {
        Ok(Some(r)) => r,
        Ok(None) => return fail("no cluster: give --cluster-nodes (and --cluster-hash), or --config"),
        Err(e) => return fail(e),
    };
    for key in &a.key {
        // An HTTP key as `larder get` takes it: its leading `/` is not part of the key.
        let k = key.strip_prefix('/').filter(|_| ring.placement() == Placement::Nginx).unwrap_or(key);
        println!("{key}\t{}", ring.nodes()[ring.owner(k.as_bytes())].name);
    }
    0
}

pub fn flush(a: FlushArgs) -> i32 {
    if !a.cluster {
        let url = format!("{}/_larder/flush?delay={}", a.target.url.trim_end_matches('/'), a.delay);
        return match call(&a.target, "POST", &url) {
            Ok((status, body)) => answer(status, &body),
            Err(code) => code,
        };
    }
    if a.delay > 30 * 86_400 {
        return fail("--delay is at most 30 days (memcached reads more as a Unix time)");
    }
    let ring = match a.ring.resolve(a.config.as_ref()) {
        Ok(Some(r)) => r,
        Ok(None) => return fail("--cluster needs --cluster-nodes (and --cluster-hash), or --config"),
        Err(e) => return fail(e),
    };
    // A node is reached at its name: a router's server given by name (twemproxy) or by a
    // socket path has none to reach.
    if let Some(n) =
        ring.nodes().iter().find(|n| n.name.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()))
    {
        return fail(format!("node {:?} is not a host:port address to reach; list the nodes by address", n.name));
    }
    let mut failed = 0;
    for node in ring.nodes() {
        let done = match ring.placement() {
            Placement::Nginx => {
                let url = format!("http://{}/_larder/flush?delay={}", node.name, a.delay);
                match call(&a.target, "POST", &url) {
                    Ok((200, _)) => Ok(()),
                    Ok((status, body)) => Err(format!("{status} {}", String::from_utf8_lossy(&body).trim_end())),
                    Err(_) => Err("unreachable".to_string()),
                }
            }
            _ => memcache_flush(&node.name, a.target.token.as_deref(), a.delay),
        };
        match done {
            Ok(()) => println!("{}\tflushed", node.name),
            Err(e) => {
                println!("{}\tFAILED: {e}", node.name);
                failed += 1;
            }
        }
    }
    if failed > 0 {
        eprintln!("larder: {failed} of {} nodes were not flushed", ring.nodes().len());
        return 1;
    }
    0
}

/// `flush_all` over memcached's text protocol, after the text login when a token is given.
fn memcache_flush(addr: &str, token: Option<&str>, delay: u64) -> Result<(), String> {
    use std::io::{BufRead, BufReader, Write};
    use std::net::ToSocketAddrs;
    let to = addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let stream = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let mut out = stream.try_clone().map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(stream);
    let mut ask = |cmd: &[u8]| -> Result<String, String> {
        out.write_all(cmd).map_err(|e| e.to_string())?;
        let mut line = String::new();
        lines.read_line(&mut line).map_err(|e| e.to_string())?;
        Ok(line.trim_end().to_string())
    };
    if let Some(t) = token {
        let cred = format!("larder {t}");
        let login = ask(format!("set _ 0 0 {}\r\n{cred}\r\n", cred.len()).as_bytes())?;
        if login != "STORED" {
            return Err(format!("login refused: {login}"));
        }
    }
    match ask(format!("flush_all {delay}\r\n").as_bytes())? {
        ok if ok == "OK" => Ok(()),
        other => Err(other),
    }
}
