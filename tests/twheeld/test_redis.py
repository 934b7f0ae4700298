#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis: two servers on one namespace of a real redis-server
(started here on a free loopback port, killed at the end). Each server
issues ids in its own range (--node N: N * 2^40 + 1, ...) and serves the
jobs it issued; a worker sees a server's jobs by connecting to it (as a
beanstalkd client pool connects to every server). kill -9 of one server:
the other goes on serving its own jobs; the killed one, started again
with the same --node, has every acknowledged job back in the right state
(its reserved job ready again, delayed keeps its due time), deleted jobs
stay deleted, and its ids go on above every id it issued.
Skipped (77) without redis-server.
Usage: test_redis.py --twheeld BINARY"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bstk import (Client, check, put_job, with_redis,  # noqa: E402
                  yaml_map)

NODE = 1 << 40


def state(c, jid):
    r = c.cmd(b"stats-job %d\r\n" % jid)
    return None if r == b"NOT_FOUND\r\n" else yaml_map(r)


def session(server):
    a, b = server(1), server(2)
    ca, cb = Client(a.port), Client(b.port)
    a1 = put_job(ca, b"a-ready")
    a2 = put_job(ca, b"a-delayed", delay=3600)
    a3 = put_job(ca, b"a-reserved")
    a4 = put_job(ca, b"a-deleted")
    b1 = put_job(cb, b"b-ready")
    bk = put_job(cb, b"b-kept", delay=3600)
    for jid in (a1, a2, a3, a4):
        check(NODE <= jid < 2 * NODE, "node 1 id %d" % jid)
    check(2 * NODE <= b1 < 3 * NODE, "node 2 id %d" % b1)
    check(ca.cmd(b"delete %d\r\n" % a4) == b"DELETED\r\n", "delete")
    # Each server serves its own jobs only.
    check(cb.cmd(b"peek %d\r\n" % a1) == b"NOT_FOUND\r\n", "b sees a1")
    check(yaml_map(cb.cmd(b"stats\r\n"))["current-jobs-ready"] == "1",
          "b's ready jobs")
    # A worker on a reserves a1 and a3; a1 is deleted, a3 stays
    # reserved when a dies.
    w = Client(a.port)
    for want in (a1, a3):
        r = w.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED %d " % want), "reserve %r" % r)
    check(w.cmd(b"delete %d\r\n" % a1) == b"DELETED\r\n", "delete a1")
    a.kill9()
    # b goes on.
    r = cb.cmd(b"reserve-with-timeout 0\r\n")
    check(r == b"RESERVED %d 7\r\nb-ready\r\n" % b1, "b after kill %r" % r)
    check(cb.cmd(b"delete %d\r\n" % b1) == b"DELETED\r\n", "delete b1")
    # a again, same node: its jobs are back.
    a = server(1)
    ca = Client(a.port)
    check(state(ca, a1) is None and state(ca, a4) is None, "deleted")
    m = state(ca, a3)
    check(m is not None and m["state"] == "ready", "a3: %r" % m)
    m = state(ca, a2)
    check(m is not None and m["state"] == "delayed" and
          3590 <= int(m["time-left"]) <= 3600, "a2: %r" % m)
    r = ca.cmd(b"reserve-with-timeout 0\r\n")
    check(r == b"RESERVED %d 10\r\na-reserved\r\n" % a3, "a3: %r" % r)
    a5 = put_job(ca, b"after")
    check(a4 < a5 < 2 * NODE, "id %d after restart" % a5)
    check(state(ca, bk) is None, "a does not serve b's jobs")
    check(yaml_map(ca.cmd(b"stats\r\n"))["current-jobs-delayed"] == "1",
          "a's delayed jobs: a2 only")
    # b after a kill -9 too: nothing of its own left, ids go on.
    b.kill9()
    b = server(2)
    cb = Client(b.port)
    st = yaml_map(cb.cmd(b"stats\r\n"))
    check(st["current-jobs-ready"] == "0" and
          st["current-jobs-delayed"] == "1", "b's jobs after restart")
    check(state(cb, bk)["state"] == "delayed", "b-kept")
    b2 = put_job(cb, b"b-after")
    check(b1 < b2 < 3 * NODE, "b id %d after restart" % b2)
    ca.close()
    cb.close()
    w.close()
    check(a.stop() == 0 and b.stop() == 0, "clean stop")


def main():
    return with_redis("tbdtest", session)


if __name__ == "__main__":
    sys.exit(main())
