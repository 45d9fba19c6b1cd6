#!/usr/bin/env python3
"""owner.py: which larder node nginx's `hash $request_uri consistent` sends a path to.

usage: owner.py --servers 127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003 PATH...
       owner.py --servers ... -            # paths one per line on stdin

Each PATH is the request URI exactly as sent, e.g. /img/caf%C3%A9.jpg (with its query
string, if any). Prints "PATH SERVER" per line. --servers takes the server strings exactly as
written in the upstream block, each optionally followed by =WEIGHT (default 1). The algorithm
is specified in docs/CLUSTER.md; stdlib only, so clients can copy it.
"""
import argparse
import bisect
import re
import struct
import sys
import zlib


def split_server(server: bytes):
    """(host, port) as nginx splits a server string: after "unix:", or at the last ':' that
    is followed only by digits; otherwise the whole string is the host and the port is empty."""
    if server[:5].lower() == b"unix:":
        return server[5:], b""
    m = re.fullmatch(rb"(.*):([0-9]*)", server, re.S)
    return (m.group(1), m.group(2)) if m else (server, b"")


class Ring:
    def __init__(self, servers):
        """servers: [(server string, weight)]; their order does not matter."""
        points = []
        for name, weight in servers:
            host, port = split_server(name.encode())
            base = host + b"\0" + port
            prev = 0
            for _ in range(160 * weight):
                # CRC32 of host \0 port followed by the previous point as 4 little-endian bytes.
                prev = zlib.crc32(base + struct.pack("<I", prev))
                points.append((prev, name))
        points.sort(key=lambda p: p[0])
        self.hashes, self.servers, self.collisions = [], [], []
        for h, name in points:
            if self.hashes and self.hashes[-1] == h:
                # nginx keeps one of the equal points, which one is unspecified.
                if self.servers[-1] != name:
                    self.collisions.append((h, self.servers[-1], name))
                continue
            self.hashes.append(h)
            self.servers.append(name)

    def owner(self, request_uri: bytes) -> str:
        i = bisect.bisect_left(self.hashes, zlib.crc32(request_uri))
        return self.servers[i % len(self.hashes)]


def parse_servers(spec: str):
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, weight = item.partition("=")
        out.append((name, int(weight) if weight else 1))
    return out


def main():
    ap = argparse.ArgumentParser(description="owner of each path in a larder cluster behind nginx")
    ap.add_argument("--servers", required=True, help="server strings as in the upstream block, comma-separated, each optionally =WEIGHT")
    ap.add_argument("paths", nargs="+", help="request URIs as sent (e.g. /k/1), or - to read them from stdin")
    a = ap.parse_args()
    ring = Ring(parse_servers(a.servers))
    for h, one, two in ring.collisions:
        print(f"owner.py: warning: {one} and {two} share point {h}; nginx's choice between them is unspecified", file=sys.stderr)
    paths = a.paths
    if paths == ["-"]:
        paths = (line.rstrip("\n") for line in sys.stdin)
    out = sys.stdout
    for p in paths:
        out.write(f"{p} {ring.owner(p.encode())}\n")


if __name__ == "__main__":
    main()
