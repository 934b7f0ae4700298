#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""twheeld --metrics-port: /metrics scraped over loopback HTTP and parsed
by prometheus_client's text parser (Debian python3-prometheus-client;
exit 77 without it). The values must be what the test did: jobs by state,
commands, bodies in memory (only the ready job's: delayed and buried jobs
keep theirs in the store), the store's own metrics. Then: 404 for another
path, 431 for a request that never ends its header, and a connection
that sends nothing neither blocks the next scrape nor stays open past its
5 s limit.
Usage: test_metrics.py --twheeld BINARY"""
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bstk import (SKIP, Client, check, free_port, start_twheeld,  # noqa: E402
                  tempdir)

try:
    from prometheus_client import parser as prom
except ImportError:
    print("SKIP: prometheus_client missing")
    sys.exit(SKIP)


def fetch(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                    timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, None, ""


def put(c, body, delay=0):
    r = c.cmd(b"put 10 %d 60 %d\r\n%s\r\n" % (delay, len(body), body))
    check(r.startswith(b"INSERTED "), "put: %r" % r)
    return int(r.split()[1])


def main():
    d = tempdir()
    mport = free_port()
    try:
        s = start_twheeld("-b", os.path.join(d, "j"), "-f", "200",
                          "--metrics-port", str(mport))
        c = Client(s.port)
        put(c, b"ready")
        put(c, b"delayed-1", delay=3600)
        put(c, b"delayed-2", delay=3600)
        b = put(c, b"to bury")
        r = c.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED "), "reserve %r" % r)
        # a (ready, id 1) comes first: put it back, then take b.
        c.cmd(b"release %d 10 0\r\n" % int(r.split()[1]))
        r = c.cmd(b"reserve-job %d\r\n" % b)
        check(r.startswith(b"RESERVED %d " % b), "reserve-job %r" % r)
        check(c.cmd(b"bury %d 1\r\n" % b) == b"BURIED\r\n", "bury")

        # A connection that sends nothing: it must not hold up a scrape.
        idle = socket.create_connection(("127.0.0.1", mport))
        t0 = time.time()
        status, ctype, text = fetch(mport, "/metrics")
        check(status == 200, "status %s" % status)
        check(ctype.startswith("text/plain; version=0.0.4"), ctype)
        value = {}
        for fam in prom.text_string_to_metric_families(text):
            for smp in fam.samples:
                key = smp.name + "".join(
                    "|%s=%s" % kv for kv in sorted(smp.labels.items()))
                value[key] = smp.value
        want = {"twheeld_jobs|state=ready": 1,
                "twheeld_jobs|state=delayed": 2,
                "twheeld_jobs|state=buried": 1,
                "twheeld_jobs|state=reserved": 0,
                "twheeld_bodies_in_memory": 1,
                "twheeld_jobs_total": 4,
                "twheeld_commands_total|cmd=put": 4,
                "twheeld_commands_total|cmd=bury": 1,
                "twheeld_connections": 1,
                # 4 jobs and the id high-water mark.
                "twheel_durable_pending": 5}
        for k, v in want.items():
            check(value.get(k) == v, "%s = %r, want %r" % (k, value.get(k), v))
        check(value["twheeld_store_writes_total"] >= 5, "store writes")
        check(value["twheel_durable_lateness_seconds_count"] == 0, "fired")

        check(fetch(mport, "/")[0] == 404, "404 for /")
        flood = socket.create_connection(("127.0.0.1", mport))
        flood.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"x" * 4000)
        reply = flood.recv(4096)
        check(reply.startswith(b"HTTP/1.1 431 "), "flood: %r" % reply[:40])
        flood.close()
        # The idle connection is closed by the server within its 5 s
        # limit (allowed: 15 s on a loaded machine).
        idle.settimeout(15)
        check(idle.recv(16) == b"", "idle connection closed")
        check(time.time() - t0 < 15, "idle closed in time")
        idle.close()
        check(fetch(mport, "/metrics")[0] == 200, "scrape after")
        c.close()
        check(s.stop() == 0, "clean stop")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
