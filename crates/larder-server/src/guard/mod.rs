//! The one policy point every door passes: who a client is ([`Identity`]), what a request or
//! command asks for ([`Permission`]) and whether the flags allow it ([`Policy::admit`]). A
//! door (the HTTP key API, the read-through proxy, the admin endpoints, memcached's text, meta
//! and binary protocols) only maps its protocol's credential onto an identity and its request
//! onto a permission, and renders the typed [`Refusal`] in its own protocol. Nothing else in
//! the server reads `--auth-token`, `--auth-reads` or `--read-only`.
//!
//! Not to be confused with `proxy/policy.rs`, RFC 9111's rules for what a shared cache stores.

pub mod budget;
pub mod ring;

use crate::config::{Settings, Token};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Who sent a request, as far as larder can tell. The policy never sees the credential itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// No credential given.
    Anonymous,
    /// A credential given, and wrong: told apart so that HTTP can say `invalid_token`.
    Rejected,
    /// larder's token given.
    Token,
}

/// What a request or command asks to do; every door classifies into this closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// `/_larder/health`, memcached `version`, `noop`, `quit`: open, for load balancers and
    /// health checks.
    Health,
    /// Read a value (GET, HEAD, get, mg, …); through the proxy, a safe method.
    Read,
    /// Store or change a value: PUT, set/add/…/cas, append, incr/decr, touch, ms, ma.
    Write,
    /// Delete a key.
    Delete,
    /// Drop every value (`flush_all`).
    Flush,
    /// Forward an unsafe method (POST, PUT, DELETE, …) through the read-through proxy: a
    /// success invalidates stored responses, so it is a write to the cache.
    Forward,
    /// Drop a stored response of the read-through cache (`/_larder/purge`).
    Purge,
    /// Stats, metrics, fault injection.
    Admin,
    /// Change a setting at run time (the slow-request threshold): refused by `--read-only`,
    /// which promises that no client changes what the server does.
    Tune,
}

impl Permission {
    /// Whether it changes what is stored (refused by `--read-only`).
    fn changes_data(self) -> bool {
        matches!(
            self,
            Permission::Write
                | Permission::Delete
                | Permission::Flush
                | Permission::Forward
                | Permission::Purge
                | Permission::Tune
        )
    }
}

/// Why a request is refused; each door renders it (HTTP 401/403, memcached's error lines,
/// the binary protocol's statuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A credential is needed and none was given.
    Unauthenticated,
    /// The credential given is wrong.
    BadCredential,
    /// `--read-only`: nothing a client sends may change what is stored.
    ReadOnly,
}

/// The names the refusals are counted under (metrics label `reason`).
pub const REFUSALS: [&str; 3] = ["unauthenticated", "bad_credential", "read_only"];

/// The doors, for counting refusals by where they happened (metrics label `door`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    Http,
    Proxy,
    Admin,
    MemcacheText,
    MemcacheBinary,
}

pub const DOORS: [&str; 5] = ["http", "proxy", "admin", "memcache_text", "memcache_binary"];

/// Whether a door's clients authenticate per connection (memcached) or per request (HTTP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    /// Every request carries its credential (HTTP's `Authorization`).
    PerRequest,
    /// A connection authenticates once, first (memcached's `-Y` text convention, binary SASL):
    /// its clients have no way to send a credential with a later command, so with a token
    /// configured an unauthenticated connection may do nothing but authenticate and the
    /// health commands, reads included (as memcached with `-Y` or SASL).
    PerConnection,
}

/// A unit of client input with a total deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A request head or command line: [`Policy::head_deadline`] in all.
    Head,
    /// A body or data block: [`Policy::body_deadline`] for what has arrived so far.
    Body,
}

pub const UNITS: [&str; 2] = ["head", "body"];

/// A body must keep up with the minimum rate from this long after it starts: time for a
/// connection's window to open and for a client to start sending.
pub const BODY_GRACE: Duration = Duration::from_secs(5);

/// The clock of one body or data block against its deadline. Only the client's time counts:
/// from a piece's arrival until the server asks for the next one (waiting for room in the
/// budget, for the writer, for an origin that reads slowly) the clock is paused, so
/// backpressure never turns into a timeout.
#[derive(Clone, Copy, Debug)]
pub struct BodyClock {
    start: tokio::time::Instant,
    received: u64,
    paused_at: Option<tokio::time::Instant>,
    polled: bool,
}

impl Default for BodyClock {
    fn default() -> BodyClock {
        BodyClock::new()
    }
}

impl BodyClock {
    /// A body whose first byte is awaited from now.
    pub fn new() -> BodyClock {
        BodyClock { start: tokio::time::Instant::now(), received: 0, paused_at: None, polled: false }
    }

    /// `n` more bytes arrived; the server's time runs from now until [`BodyClock::resume`].
    pub fn arrived(&mut self, n: u64) {
        self.received += n;
        self.paused_at.get_or_insert_with(tokio::time::Instant::now);
    }

    /// The server asks for more: the time since the last arrival was its own.
    pub fn resume(&mut self) {
        if let Some(at) = self.paused_at.take() {
            self.start += at.elapsed();
        }
    }

    /// [`BodyClock::resume`] for a poll-driven body, on every poll: `true` the first time after
    /// an arrival (and at the start), when the deadline has moved.
    pub fn resume_at_poll(&mut self) -> bool {
        let moved = !self.polled || self.paused_at.is_some();
        self.polled = true;
        self.resume();
        moved
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// When the rest must have come, under `policy` (`None`: no minimum rate).
    pub fn deadline(&self, policy: &Policy) -> Option<tokio::time::Instant> {
        policy.body_deadline(self.received).map(|d| self.start + d)
    }
}

/// The flags that decide access and time, and the counters of refusals and of clients closed
/// for missing their deadlines.
pub struct Policy {
    token: Option<Token>,
    auth_reads: bool,
    read_only: bool,
    head_timeout: Duration,
    min_body_rate: u64,
    refused: [[AtomicU64; REFUSALS.len()]; DOORS.len()],
    late: [[AtomicU64; UNITS.len()]; DOORS.len()],
}

impl Policy {
    pub fn new(s: &Settings) -> Policy {
        Policy {
            token: s.auth_token.clone(),
            auth_reads: s.auth_reads,
            read_only: s.read_only,
            head_timeout: s.header_timeout,
            min_body_rate: s.min_body_rate,
            refused: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            late: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// How long a request head or command line may take in all, from its first byte
    /// (`--header-timeout`; zero: no limit).
    pub fn head_deadline(&self) -> Option<Duration> {
        (!self.head_timeout.is_zero()).then_some(self.head_timeout)
    }

    /// How long after its start a body or data block may wait for more once `received` bytes
    /// of it have come: a minimum average rate after a grace (`--min-body-rate`; zero: none).
    pub fn body_deadline(&self, received: u64) -> Option<Duration> {
        let rate = self.min_body_rate;
        (rate > 0).then(|| BODY_GRACE + Duration::from_secs_f64(received as f64 / rate as f64))
    }

    /// Counts a client closed for missing a deadline.
    pub fn late(&self, door: Door, unit: Unit) {
        self.late[door as usize][unit as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Every (door, unit, count) of clients closed for their deadline, counts above zero.
    pub fn lates(&self) -> Vec<(&'static str, &'static str, u64)> {
        nonzero(&self.late, &UNITS)
    }

    /// Whether a token is configured (a door that must ask for a credential asks).
    pub fn needs_credentials(&self) -> bool {
        self.token.is_some()
    }

    /// The identity of a client that presented `secret` (`None`: nothing), compared with the
    /// token in constant time.
    pub fn identify(&self, secret: Option<&[u8]>) -> Identity {
        use subtle::ConstantTimeEq;
        match (secret, &self.token) {
            (None, _) => Identity::Anonymous,
            (Some(_), None) => Identity::Token, // no token configured: any credential will do
            (Some(s), Some(t)) if bool::from(s.ct_eq(&t.0)) => Identity::Token,
            (Some(_), Some(_)) => Identity::Rejected,
        }
    }

    /// Whether `who` may do `what` on a door whose clients authenticate as `session` says.
    /// The one table of the server's access rules:
    ///
    /// | permission | no token | token set |
    /// |---|---|---|
    /// | Health | open | open |
    /// | Read | open | open per request without `--auth-reads`; else the token |
    /// | Admin | open | the token |
    /// | Write, Delete, Flush, Forward, Purge, Tune | open unless `--read-only` | the token, and not `--read-only` |
    ///
    /// On a per-connection door, everything but Health needs the token when one is set.
    pub fn admit(&self, door: Door, session: Session, who: Identity, what: Permission) -> Result<(), Refusal> {
        let r = self.decide(session, who, what);
        if let Err(refusal) = r {
            self.count(door, refusal);
        }
        r
    }

    /// Counts a refusal a door made in the course of a credential exchange (a failed login).
    pub fn count(&self, door: Door, refusal: Refusal) {
        self.refused[door as usize][refusal as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn decide(&self, session: Session, who: Identity, what: Permission) -> Result<(), Refusal> {
        if what == Permission::Health {
            return Ok(());
        }
        let open_read = what == Permission::Read && !self.auth_reads && session == Session::PerRequest;
        if self.token.is_some() && !open_read {
            match who {
                Identity::Token => {}
                Identity::Anonymous => return Err(Refusal::Unauthenticated),
                Identity::Rejected => return Err(Refusal::BadCredential),
            }
        }
        if self.read_only && what.changes_data() {
            return Err(Refusal::ReadOnly);
        }
        Ok(())
    }

    /// Every (door, reason, count) with a count above zero.
    pub fn refusals(&self) -> Vec<(&'static str, &'static str, u64)> {
        nonzero(&self.refused, &REFUSALS)
    }
}

/// The counts above zero of a door × `names` table, with their names.
fn nonzero<const N: usize>(
    table: &[[AtomicU64; N]],
    names: &[&'static str; N],
) -> Vec<(&'static str, &'static str, u64)> {
    let mut v = Vec::new();
    for (d, row) in table.iter().enumerate() {
        for (i, n) in row.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                v.push((DOORS[d], names[i], n));
            }
        }
    }
    v
}

/// Door × name counts as `{"door": {"name": n}, …}`.
fn by_door_json(counts: Vec<(&'static str, &'static str, u64)>) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (door, name, n) in counts {
        let e = m.entry(door).or_insert_with(|| serde_json::json!({}));
        e[name] = n.into();
    }
    serde_json::Value::Object(m)
}

/// The refusals, copied into the metrics when scraped.
pub fn render_metrics(p: &Policy) {
    for (door, reason, n) in p.refusals() {
        metrics::counter!("larder_refusals_total", "door" => door, "reason" => reason).absolute(n);
    }
    for (door, unit, n) in p.lates() {
        metrics::counter!("larder_deadline_closes_total", "door" => door, "unit" => unit).absolute(n);
    }
}

/// The refusals for `/_larder/stats`: `{"memcache_text": {"unauthenticated": 2}, …}`.
pub fn refusals_json(p: &Policy) -> serde_json::Value {
    by_door_json(p.refusals())
}

/// Clients closed for missing a deadline, for `/_larder/stats`: `{"http": {"body": 1}, …}`.
pub fn lates_json(p: &Policy) -> serde_json::Value {
    by_door_json(p.lates())
}

/// Flag combinations that cannot be honoured, refused at start with one line naming the
/// conflict (no flag is silently ignored).
pub fn check_flags(s: &Settings) -> Result<(), String> {
    if s.auth_reads && s.auth_token.is_none() {
        return Err(
            "--auth-reads needs a token (--auth-token FILE or LARDER_AUTH_TOKEN): without one, reads would stay open"
                .into(),
        );
    }
    if s.origin.is_some() && s.memcache_listen.is_some() {
        // The proxy's stored responses live under keys a binary memcached key can spell: a
        // memcached client could read or rewrite them.
        return Err("--memcache-listen cannot be combined with --origin: memcached clients would reach the read-through cache's stored responses".into());
    }
    if s.origin.is_some() && s.verify_cas {
        // The key API it verifies is not served in read-through mode.
        return Err(
            "--verify-cas cannot be combined with --origin: read-through mode serves no key API to verify uploads to"
                .into(),
        );
    }
    if s.origin.is_some() && s.cluster.is_some() {
        // Stored responses are kept by their freshness; ring awareness would cut it short on
        // every node but one, and read-through nodes are not placed by a key router.
        return Err(
            "--cluster-self cannot be combined with --origin: ring awareness is for cache nodes behind a key router"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{AtomicU64, Door, Duration, Identity, Permission, Policy, Refusal, Session};
    use Identity::*;
    use Permission::*;
    use Session::*;

    fn policy(token: bool, auth_reads: bool, read_only: bool) -> Policy {
        Policy {
            token: token.then(|| crate::config::Token(b"t0k3n".to_vec())),
            auth_reads,
            read_only,
            head_timeout: Duration::from_secs(10),
            min_body_rate: 64 << 10,
            refused: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            late: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    #[test]
    fn identities_are_told_apart_in_constant_time_comparisons() {
        let p = policy(true, false, false);
        assert_eq!(p.identify(None), Anonymous);
        assert_eq!(p.identify(Some(b"t0k3n")), Token);
        assert_eq!(p.identify(Some(b"t0k3")), Rejected, "a prefix");
        assert_eq!(p.identify(Some(b"t0k3nx")), Rejected, "the token and more");
        assert_eq!(policy(false, false, false).identify(Some(b"anything")), Token);
    }

    #[test]
    fn the_table() {
        let all = [Health, Read, Write, Delete, Flush, Forward, Purge, Admin];
        // No token: everything open; read-only refuses what changes data.
        for what in all {
            let p = policy(false, false, false);
            assert_eq!(p.decide(PerRequest, Anonymous, what), Ok(()));
            assert_eq!(p.decide(PerConnection, Anonymous, what), Ok(()));
            let ro = policy(false, false, true);
            let want = if what.changes_data() { Err(Refusal::ReadOnly) } else { Ok(()) };
            assert_eq!(ro.decide(PerRequest, Anonymous, what), want, "{what:?}");
            assert_eq!(ro.decide(PerConnection, Token, what), want, "{what:?}");
        }
        // A token: per request, reads and health are open; per connection, health only.
        let p = policy(true, false, false);
        for what in all {
            let open = matches!(what, Health | Read);
            assert_eq!(p.decide(PerRequest, Anonymous, what).is_ok(), open, "{what:?}");
            assert_eq!(p.decide(PerConnection, Anonymous, what).is_ok(), what == Health, "{what:?}");
            assert_eq!(p.decide(PerConnection, Token, what), Ok(()));
            if what != Health && what != Read {
                assert_eq!(p.decide(PerRequest, Rejected, what), Err(Refusal::BadCredential));
                assert_eq!(p.decide(PerRequest, Anonymous, what), Err(Refusal::Unauthenticated));
            }
        }
        // --auth-reads closes reads; health stays open.
        let p = policy(true, true, false);
        assert_eq!(p.decide(PerRequest, Anonymous, Read), Err(Refusal::Unauthenticated));
        assert_eq!(p.decide(PerRequest, Anonymous, Health), Ok(()));
        // A token and read-only: the token does not lift read-only.
        let p = policy(true, false, true);
        assert_eq!(p.decide(PerRequest, Token, Write), Err(Refusal::ReadOnly));
        assert_eq!(p.decide(PerRequest, Anonymous, Write), Err(Refusal::Unauthenticated));
        assert_eq!(p.decide(PerConnection, Token, Read), Ok(()));
    }

    #[test]
    fn a_body_clock_counts_the_clients_time_only() {
        let p = policy(false, false, false); // 64 KiB/s after the grace
        let mut c = super::BodyClock::new();
        let first = c.deadline(&p).unwrap();
        assert!(c.resume_at_poll(), "the first poll sets the deadline");
        assert!(!c.resume_at_poll(), "waiting polls leave it");
        c.arrived(64 << 10);
        // The server takes its time before asking for more: the deadline moves with it.
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.resume_at_poll());
        let later = c.deadline(&p).unwrap();
        let moved = later - first;
        assert!(moved >= Duration::from_millis(1050), "a second for 64 KiB, plus the server's 50 ms: {moved:?}");
        // The client's own time is not forgiven.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(c.deadline(&p).unwrap(), later);
    }

    #[test]
    fn refusals_are_counted_by_door_and_reason() {
        let p = policy(true, false, true);
        let _ = p.admit(Door::MemcacheText, PerConnection, Anonymous, Read);
        let _ = p.admit(Door::Http, PerRequest, Token, Delete);
        let _ = p.admit(Door::Http, PerRequest, Token, Read);
        assert_eq!(p.refusals(), vec![("http", "read_only", 1), ("memcache_text", "unauthenticated", 1)]);
    }
}
