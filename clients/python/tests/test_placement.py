"""The client's choice of node agrees with nginx's: three nodes behind a real nginx
(deploy/nginx/run-cluster, `hash $request_uri consistent`), 10,000 keys, each asked through
nginx, whose answer names the node it forwarded to (`X-Larder-Node`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import urllib3

import larder
from conftest import ROOT, free_port, larder_bin


def keys() -> list[str]:
    # Plain, nested, spaced, reserved and non-ASCII keys: the canonical form is what is hashed.
    odd = ["a b", "caf\u00e9", "100%", "q?x=1", "#frag", "x+y", "\u65e5\u672c/\u8a9e", "~tilde", "a//b", "A-Z_0.9"]
    return [f"{odd[i % len(odd)]}/{i}" if i % 3 == 0 else f"k/{i}" for i in range(10_000)]


def test_the_client_and_nginx_pick_the_same_node_for_10000_keys() -> None:
    base = free_port()
    while any(_busy(base + k) for k in range(4)):
        base = free_port()
    env = dict(os.environ, LARDER_BIN=larder_bin())
    proc = subprocess.Popen(
        [str(ROOT / "deploy/nginx/run-cluster"), "3", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
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
            assert line, "run-cluster ended before `cluster ready` (is nginx installed?)"
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
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _busy(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
