"""Three larder nodes behind twemproxy (Debian's nutcracker, deploy/twemproxy/nutcracker.yml:
ketama, auto_eject_hosts), driven with pymemcache through the proxy as an application would.

  twemproxy_rejoin.py LARDER NUTCRACKER TEMPLATE DIR BASE_PORT placement
  twemproxy_rejoin.py LARDER NUTCRACKER TEMPLATE DIR BASE_PORT rejoin safe|plain

placement: for twemproxy's fnv1a_64 and md5 hashes, 10,000 keys set through the proxy are
found on the node `larder owner` names, and nodes told the ring count no foreign write.

rejoin: one node is killed (SIGKILL) while the keys are written again, is restarted once the
proxy has ejected it, and rejoins; later it fails a second time. `safe` runs the nodes with the
flags docs/CLUSTER.md gives for this router (ring awareness, --foreign-ttl, --max-downtime 0s),
`plain` without them. Prints one JSON line: the stale reads after the rejoin and after the
second failure (a value older than the last one written, served as current).
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

LARDER, NUTCRACKER, TEMPLATE, DIR = sys.argv[1:5]
BASE = int(sys.argv[5])
WHAT = sys.argv[6]
MODE = sys.argv[7] if len(sys.argv) > 7 else ""
KEYS = 10_000
FOREIGN_TTL = 3
RETRY_MS = 2000
PROXY = ("127.0.0.1", BASE)
MC = [BASE + 1 + k for k in range(3)]
HTTP = [BASE + 11 + k for k in range(3)]
NODES = ",".join(f"127.0.0.1:{p}" for p in MC)
procs = []


def key(i):
    return f"k:{i}"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def start_node(k, aware, hash_name, safe):
    args = [LARDER, "serve", "--data-dir", f"{DIR}/node-{k}", "--listen", f"127.0.0.1:{HTTP[k]}",
            "--memcache-listen", f"127.0.0.1:{MC[k]}", "--volume-size", "16MiB", "--volume-count", "8",
            "--memory-capacity", "16MiB"]
    if aware:
        args += ["--cluster-nodes", NODES, "--cluster-self", f"127.0.0.1:{MC[k]}", "--cluster-hash", hash_name]
    if safe:
        # docs/CLUSTER.md's flags for a router that ejects nodes (the idle timeout off: the
        # router counts a closed idle connection as a failure).
        args += ["--foreign-ttl", f"{FOREIGN_TTL}s", "--max-downtime", "0s", "--idle-timeout", "0"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(f"{DIR}/node-{k}.log", "a"))
    procs.append(p)
    deadline = time.time() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{HTTP[k]}/_larder/health", timeout=2) as r:
                if r.status == 200:
                    return p
        except OSError:
            pass
        if p.poll() is not None or time.time() > deadline:
            sys.exit(f"node {k} did not start; see {DIR}/node-{k}.log")
        time.sleep(0.05)


def start_proxy(hash_fn):
    # The shipped file, with this run's addresses and a short retry so the test is quick.
    lines = []
    for line in open(TEMPLATE):
        s = line.strip()
        if s.startswith("listen:"):
            line = line.replace(s, f"listen: 127.0.0.1:{BASE}")
        elif s.startswith("hash:"):
            line = line.replace(s, f"hash: {hash_fn}")
        elif s.startswith("server_retry_timeout:"):
            line = line.replace(s, f"server_retry_timeout: {RETRY_MS}")
        elif s.startswith("- 127.0.0.1:"):
            continue
        lines.append(line)
        if s == "servers:":
            lines += [f"   - 127.0.0.1:{p}:1\n" for p in MC]
    conf = f"{DIR}/nutcracker-{hash_fn}.yml"
    open(conf, "w").write("".join(lines))
    p = subprocess.Popen([NUTCRACKER, "-c", conf, "-s", str(BASE + 20), "-a", "127.0.0.1",
                          "-o", f"{DIR}/nutcracker.log", "-p", f"{DIR}/nutcracker.pid"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    procs.append(p)
    deadline = time.time() + 10
    while True:
        try:
            c = client()
            c.version()
            c.close()
            return p
        except (OSError, MemcacheError):
            if p.poll() is not None or time.time() > deadline:
                sys.exit(f"nutcracker did not start; see {DIR}/nutcracker.log")
            time.sleep(0.05)


def client(port=None):
    return Client(("127.0.0.1", port) if port else PROXY, connect_timeout=2, timeout=5)


def retrying(f, what):
    """f() through the proxy, again until it succeeds: while a dead node is not yet ejected,
    or is tried again after its retry timeout, its keys' commands fail."""
    deadline = time.time() + 60
    while True:
        c = client()
        try:
            return f(c)
        except (OSError, MemcacheError) as e:
            if time.time() > deadline:
                raise SystemExit(f"{what} kept failing: {e!r}")
            time.sleep(0.05)
        finally:
            c.close()


def write_all(version):
    for lo in range(0, KEYS, 200):
        batch = {key(i): f"v{version}:{i}".encode() for i in range(lo, min(lo + 200, KEYS))}

        def put(c):
            failed = c.set_many(batch, noreply=False)
            if failed:
                raise MemcacheError(f"not stored: {failed[:3]}")

        retrying(put, f"writing v{version}")


def read_all():
    got = {}
    for lo in range(0, KEYS, 200):
        keys = [key(i) for i in range(lo, min(lo + 200, KEYS))]
        got.update(retrying(lambda c: c.get_many(keys), "reading"))
    return got


def owners(hash_name):
    out = subprocess.run([LARDER, "owner", "--cluster-nodes", NODES, "--cluster-hash", hash_name]
                         + [key(i) for i in range(KEYS)], check=True, capture_output=True, text=True).stdout
    return [NODES.split(",").index(line.split("\t")[1]) for line in out.splitlines()]


def gets(k):
    c = client(MC[k])
    try:
        return int(c.stats()[b"cmd_get"])
    finally:
        c.close()


def foreign_writes(k):
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP[k]}/_larder/stats", timeout=5) as r:
        return json.load(r)["cluster"]["foreign_writes"]


def flush_cluster():
    subprocess.run([LARDER, "flush", "--cluster", "--cluster-nodes", NODES, "--cluster-hash", "ketama"],
                   check=True, capture_output=True)


def placement():
    result = {}
    for hash_fn, hash_name in [("fnv1a_64", "ketama-fnv1a_64"), ("md5", "ketama")]:
        nodes = [start_node(k, True, hash_name, False) for k in range(3)]
        proxy = start_proxy(hash_fn)
        write_all(1)
        want = owners(hash_name)
        where = [None] * KEYS
        for k in range(3):
            c = client(MC[k])
            for lo in range(0, KEYS, 500):
                for kk in c.get_many([key(i) for i in range(lo, min(lo + 500, KEYS))]):
                    i = int(kk.split(":")[1])
                    assert where[i] is None, f"{kk} on two nodes"
                    where[i] = k
            c.close()
        result[hash_fn] = {
            "keys": KEYS,
            "on_owner": sum(1 for i in range(KEYS) if where[i] == want[i]),
            "foreign_writes": [foreign_writes(k) for k in range(3)],
            "per_node": [where.count(k) for k in range(3)],
        }
        flush_cluster()  # `larder flush --cluster`: every node, over memcached's protocol
        result[hash_fn]["after_flush"] = len(read_all())
        for p in [proxy] + nodes:
            p.terminate()
            p.wait()
    print(json.dumps(result))


def rejoin(safe):
    nodes = [start_node(k, safe, "ketama-fnv1a_64", safe) for k in range(3)]
    start_proxy("fnv1a_64")
    own = owners("ketama-fnv1a_64")
    victim = 0
    mine = [i for i in range(KEYS) if own[i] == victim]
    write_all(1)
    assert read_all() == {key(i): f"v1:{i}".encode() for i in range(KEYS)}
    # The node dies; the keys are written again, its keys landing elsewhere once it is ejected.
    nodes[victim].send_signal(signal.SIGKILL)
    nodes[victim].wait()
    t = time.time()
    write_all(2)
    log(f"v2 written in {time.time() - t:.1f} s with node {victim} down")
    # It comes back on its data, and rejoins once the proxy tries it again.
    nodes[victim] = start_node(victim, safe, "ketama-fnv1a_64", safe)
    # Until the proxy tries it again (server_retry_timeout), its keys are read from the
    # others; from then on from the node itself, which counts the get.
    deadline = time.time() + 4 * RETRY_MS / 1000 + 5
    while True:
        before = gets(victim)
        retrying(lambda c: c.get(key(mine[0])), "a read of one of its keys")
        if gets(victim) > before:
            break
        if time.time() > deadline:
            sys.exit("the proxy did not take the restarted node back")
        time.sleep(0.1)
    got = read_all()
    stale_rejoin = sum(1 for i in range(KEYS) if got.get(key(i), b"v2").decode().split(":")[0] != "v2")
    missing_rejoin = sum(1 for i in range(KEYS) if key(i) not in got)
    # The keys are written once more, then the same node fails again: the copies the first
    # outage left on the others must not come back.
    write_all(3)
    time.sleep(FOREIGN_TTL + 1)
    nodes[victim].send_signal(signal.SIGKILL)
    nodes[victim].wait()
    got = read_all()
    stale_second = sum(1 for i in range(KEYS) if got.get(key(i), b"v3").decode().split(":")[0] != "v3")
    print(json.dumps({
        "keys": KEYS, "victim_keys": len(mine),
        "stale_after_rejoin": stale_rejoin, "missing_after_rejoin": missing_rejoin,
        "stale_after_second_failure": stale_second,
        "foreign_writes": [foreign_writes(k) for k in range(3) if k != victim] if safe else None,
    }))


try:
    os.makedirs(DIR, exist_ok=True)
    if WHAT == "placement":
        placement()
    else:
        rejoin(MODE == "safe")
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
