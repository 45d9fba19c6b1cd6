"""The client's choice of node agrees with nginx's: three nodes behind a real nginx
(deploy/nginx/run-cluster, `hash $request_uri consistent`), 10,000 keys, each asked through
nginx, whose answer names the node it forwarded to (`X-Larder-Node`)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import tempfile
import time

import urllib3

import larder
from conftest import ROOT, larder_bin


def keys() -> list[str]:
    # Plain, nested, spaced, reserved and non-ASCII keys: the canonical form is what is hashed.
    odd = ["a b", "caf\u00e9", "100%", "q?x=1", "#frag", "x+y", "\u65e5\u672c/\u8a9e", "~tilde", "a//b", "A-Z_0.9"]
    return [f"{odd[i % len(odd)]}/{i}" if i % 3 == 0 else f"k/{i}" for i in range(10_000)]


def test_the_client_and_nginx_pick_the_same_node_for_10000_keys() -> None:
    # Four consecutive ports below the kernel's ephemeral range, so that no outgoing
    # connection takes one of them while the cluster starts.
    base = random.randrange(20_000, 30_000, 10)
    while not all(_bindable(base + k) for k in range(4)):
        base = random.randrange(20_000, 30_000, 10)
    env = dict(os.environ, LARDER_BIN=larder_bin())
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [str(ROOT / "deploy/nginx/run-cluster"), "3", str(base)],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = proc.stdout.readline().decode()
            if "cluster ready" in line:
                break
            if not line:
                log.seek(0)
                raise AssertionError(f"run-cluster ended before `cluster ready`: {log.read().decode()[-2000:]}")
        nodes = [f"http://127.0.0.1:{base + k}" for k in (1, 2, 3)]
        client = larder.Client(nodes)
        pool = urllib3.PoolManager(maxsize=8)
        disagree = []
        for key in keys():
            path = larder.canonical(key)
            r = pool.request("GET", f"http://127.0.0.1:{base}/{path}", retries=False)
            via_nginx = r.headers.get("X-Larder-Node")
            mine = client.url(key).split("/")[2]
            assert r.status == 404, (key, r.status)
            if via_nginx != mine:
                disagree.append((key, mine, via_nginx))
        assert not disagree, f"{len(disagree)} of 10000 keys differ, e.g. {disagree[:3]}"
        # The asyncio client sends the same paths: what it stores, nginx finds on the owner.
        special = [f"p:q!r$s'(t)*u,v&w=x;y@z/{i}" for i in range(300)]

        async def store() -> None:
            async with larder.AsyncClient(nodes) as ac:
                await ac.set_many({k: b"v" for k in special})

        asyncio.run(store())
        for key in special:
            r = pool.request("GET", f"http://127.0.0.1:{base}/{larder.canonical(key)}", retries=False)
            assert r.status == 200, (key, r.headers.get("X-Larder-Node"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_the_client_and_larder_owner_pick_the_same_node() -> None:
    # A node told the ring (--cluster-nodes) decides which keys it owns as `larder owner`
    # does: the client's placement must be that one too, for odd keys as well.
    from larder._keys import Ring, canonical

    servers = ["127.0.0.1:8001", "127.0.0.1:8002", "10.0.0.7:80", "[::1]:8004"]
    ring = Ring(servers)
    ks = keys()[:3000]
    out = subprocess.run(
        [larder_bin(), "owner", "--cluster-hash", "nginx", "--cluster-nodes", ",".join(servers), *ks],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert len(out) == len(ks)
    disagree = [k for k, line in zip(ks, out) if servers[ring.owner(canonical(k))] != line.split("\t")[-1]]
    assert disagree == []
