#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis: a dead server's jobs are taken over by the others.
Two servers (--node 1 and 2) on one namespace of a real redis-server
(started here on a free loopback port, killed at the end). Through A:
20 jobs delayed 2 s, one job reserved with TTR 3 s, 5 ready jobs and 3
buried ones. kill -9 of A; a worker on B alone must get all of them:
each delayed job not before its due time, the reserved one not before
its TTR ran out, the ready ones by reserve, the buried ones buried (a
kick-job on B answers KICKED, and only then are they reserved), every
one within TAKEOVER_BOUND seconds of the kill. The bound, as
docs/guide/twheeld.md states it: A's liveness record runs out 10 s after
its last renewal, plus the store's shard lease (5 s) for A's shards to
move and the claim A held (at most the shard lease again), plus margin
for a loaded machine.
Before that, 20 jobs reserved from A by a connection that then closes
are A's ready jobs: B must not take them once their lease would have run
out (TTR + 2 s + LEFT_MARGIN). Then A is started again (same --node): it serves none of the jobs B took
(each job is delivered once), and B after a kill -9 and restart has none
of them back either (B deleted each one).
Then, on a namespace of its own, a server alone: killed with -9 and
started again after its liveness record ran out (LIVE_OUT), it must not
wait for a takeover that no other server will do (its own store fires
the record) and has its ready and buried jobs back.
Skipped (77) without redis-server.
Usage: test_takeover.py --twheeld BINARY"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bstk import (Client, check, put_job, with_redis,  # noqa: E402
                  yaml_map)

TAKEOVER_BOUND = 30.0
DELAYED = 20
READY = 5
BURIED = 3
LEFT_MARGIN = 3.0
LIVE_OUT = 12.0  # past the liveness record's 10 s  # past TTR + grace: B would have fired a dated lease


def session(server):
    a, b = server(1), server(2)
    ca = Client(a.port)
    # Jobs a worker reserved and then left (its connection closed) are
    # ready on A again and stay A's: B must not take them when their
    # reserve's TTR + 2 s runs out (20 jobs: their shards are on B too).
    w2 = Client(a.port)
    left = [put_job(ca, b"left-%d" % i, ttr=1) for i in range(20)]
    for _ in left:
        check(w2.cmd(b"reserve-with-timeout 0\r\n").startswith(
            b"RESERVED "), "reserve")
    w2.close()
    time.sleep(1 + 2 + LEFT_MARGIN)
    check(b.rss_kb() > 0 and Client(b.port).cmd(
        b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n",
        "B took a job reserved from A and released by a closed connection")
    for jid in left:
        check(ca.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n",
              "A's job %d" % jid)
    # Buried jobs of A (priority 0: reserved before anything else).
    buried = [put_job(ca, b"buried-%d" % i, pri=0) for i in range(BURIED)]
    wb = Client(a.port)
    for jid in buried:
        r = wb.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED %d " % jid), "reserve %r" % r)
        check(wb.cmd(b"bury %d 0\r\n" % jid) == b"BURIED\r\n", "bury")
    wb.close()
    t_put = time.monotonic()
    delayed = {put_job(ca, b"delayed-%d" % i, delay=2): b"delayed-%d" % i
               for i in range(DELAYED)}
    leased = put_job(ca, b"leased", ttr=3)
    # Ready jobs of A (priority 100: after the leased one).
    ready = {put_job(ca, b"ready-%d" % i, pri=100): b"ready-%d" % i
             for i in range(READY)}
    w = Client(a.port)
    # RESERVED comes once the job's lease is in Redis.
    r = w.cmd(b"reserve-with-timeout 0\r\n")
    t_reserve = time.monotonic()
    check(r == b"RESERVED %d 6\r\nleased\r\n" % leased, "reserve %r" % r)
    a.kill9()
    t_kill = time.monotonic()
    # A worker on B gets every one of A's jobs.
    cb = Client(b.port, timeout=30)
    got = {}
    kicked = set()
    while len(got) < DELAYED + 1 + READY + BURIED and \
            time.monotonic() - t_kill < TAKEOVER_BOUND:
        for jid in set(buried) - kicked:
            r = cb.cmd(b"kick-job %d\r\n" % jid)
            check(r in (b"KICKED\r\n", b"NOT_FOUND\r\n"), "kick %r" % r)
            if r == b"KICKED\r\n":
                kicked.add(jid)
        r = cb.cmd(b"reserve-with-timeout 1\r\n")
        if r == b"TIMED_OUT\r\n":
            continue
        head, body = r.split(b"\r\n")[:2]
        jid = int(head.split()[1])
        check(jid not in got, "job %d delivered twice" % jid)
        check(jid not in buried or jid in kicked,
              "buried job %d ready on B before a kick" % jid)
        got[jid] = (body, time.monotonic())
        check(cb.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n", "delete")
    missing = set(delayed) - set(got)
    check(not missing, "not taken over within %.0f s: %r" %
          (TAKEOVER_BOUND, sorted(missing)))
    check(leased in got, "the reserved job was not taken over")
    missing = (set(ready) | set(buried)) - set(got)
    check(not missing, "ready and buried jobs not taken over within %.0f s:"
          " %r" % (TAKEOVER_BOUND, sorted(missing)))
    for jid, body in ready.items():
        check(got[jid][0] == body, "job %d body %r" % (jid, got[jid][0]))
    for i, jid in enumerate(buried):
        check(got[jid][0] == b"buried-%d" % i, "buried job %d body" % jid)
    for jid, body in delayed.items():
        check(got[jid][0] == body, "job %d body %r" % (jid, got[jid][0]))
        check(got[jid][1] >= t_put + 2, "job %d before its delay" % jid)
    check(got[leased][0] == b"leased", "leased body")
    check(got[leased][1] >= t_reserve + 3, "leased job before its TTR")
    late = max(t for _, t in got.values()) - t_kill
    print("taken over: %d jobs, the last %.1f s after the kill" %
          (len(got), late))
    # A again: none of them (B holds or deleted them).
    a = server(1)
    ca = Client(a.port)
    st = yaml_map(ca.cmd(b"stats\r\n"))
    check(st["current-jobs-ready"] == "0" and
          st["current-jobs-buried"] == "0" and
          st["current-jobs-reserved"] == "0", "A after restart: %r" %
          {k: st[k] for k in ("current-jobs-ready", "current-jobs-buried",
                              "current-jobs-delayed")})
    for jid in got:
        check(ca.cmd(b"peek %d\r\n" % jid) == b"NOT_FOUND\r\n",
              "A serves job %d again" % jid)
    b.kill9()
    b = server(2)
    cb = Client(b.port)
    check(cb.cmd(b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n",
          "B after restart has a deleted job back")
    for c in (ca, cb, w):
        c.close()
    check(a.stop() == 0 and b.stop() == 0, "clean stop")


def alone(server):
    a = server(1)
    ca = Client(a.port)
    ready = [put_job(ca, b"r%d" % i) for i in range(3)]
    jid = put_job(ca, b"b", pri=0)
    check(ca.cmd(b"reserve-with-timeout 0\r\n").startswith(
        b"RESERVED %d " % jid), "reserve")
    check(ca.cmd(b"bury %d 0\r\n" % jid) == b"BURIED\r\n", "bury")
    a.kill9()
    time.sleep(LIVE_OUT)
    # server() waits for the port (bstk.wait_port: 20 s at most).
    a = server(1)
    ca = Client(a.port)
    st = yaml_map(ca.cmd(b"stats\r\n"))
    check(st["current-jobs-ready"] == "3" and st["current-jobs-buried"] ==
          "1", "alone after restart: %r" %
          {k: st[k] for k in ("current-jobs-ready", "current-jobs-buried")})
    for i in ready:
        check(ca.cmd(b"peek %d\r\n" % i).startswith(b"FOUND "), "peek")
    ca.close()
    check(a.stop() == 0, "clean stop")


def main():
    rc = with_redis("takeover", session)
    return rc if rc else with_redis("alone", alone)


if __name__ == "__main__":
    sys.exit(main())
