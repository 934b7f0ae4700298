#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis: records in Redis that twheeld did not write. A real
redis-server (started here on a free loopback port, killed at the end)
gets, through a raw socket, records in the layout of the store (a shard's
:p hash "due,attempt,payload" and :d sorted set) whose payloads are
hostile: job records (twheeld/record.c tbd_rec_encode()) truncated, too long,
with a wrong body length, an unknown state, a tube name no client may
send, a key that names another id or none, an absurd creation or due
time, an id in the server's own range that it has not issued yet;
liveness records ("n<node>") with garbage, a node that is not the key's,
the server's own node, a due time far ahead, a key without a number, and
2,000 records of servers that never existed. Beside them a dead node 3
with a valid liveness record and valid jobs (a ready one, a buried one).
The server (--node 1, alone: it owns every shard) must start at once
(its own liveness record is garbage), serve none of the hostile job
records, take over node 3's valid jobs with their fields, remove the
liveness records it cannot use, answer a kick of a delayed job (a query
of the store's query thread) within KICK_BOUND while the 2,000 are taken
over, and meanwhile answer stats and serve a fresh put/reserve/delete.
Every wait is a bounded loop (BOUND). The jobs of node 3 are records in
job_write()'s layout planted here, not written by a server killed with
-9 (test_takeover.py does that): so the test takes seconds, not 30.
Skipped (77) without redis-server.
Usage: test_hostile.py --twheeld BINARY"""
import os
import socket
import struct
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bstk  # noqa: E402
from bstk import Client, check, put_job, with_redis, yaml_map  # noqa: E402

NS = "hostile"
SHARDS = 64  # the library's default shard count
NODE = 1 << 40  # --node N: ids N * 2^40 + 1, ...
NEVER = 32503680000000  # a record that never fires (store.c STORE_DUE)
BOUND = 15.0  # seconds for what the server does on its own (fires, takes)
FAKE_SERVERS = 2000
KICK_BOUND = 3.0  # seconds: a few takeover scans, not one per fake server


def now_ms():
    return int(time.time() * 1000)


class Resp:
    """Just enough of RESP to send commands with binary arguments."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.s.makefile("rb")

    def send(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)

    def read(self):
        ln = self.f.readline()[:-2]
        t, rest = ln[:1], ln[1:]
        if t in (b"+", b":"):
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if t == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError("RESP %r" % ln)

    def cmd(self, *args):
        self.send(*args)
        return self.read()


def shard(key):
    h = 1469598103934665603
    for b in key:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % SHARDS


def plant(r, key, due, payload):
    """key := payload due at @due, as the store writes it (pipelined)."""
    tag = b"{%s:%d}" % (NS.encode(), shard(key))
    r.send(b"HSET", tag + b":p", key, b"%d,1,%s" % (due, payload))
    r.send(b"ZADD", tag + b":d", max(due, 0), key)


def planted(r, key):
    tag = b"{%s:%d}" % (NS.encode(), shard(key))
    return r.cmd(b"HEXISTS", tag + b":p", key) == b"1"


def rearmed(r, key, t):
    """True once the store fired @key (planted due at @t) to this server:
    it keeps a fired job's record, due again days later (store.c
    FIRED_KEEP_MS)."""
    tag = b"{%s:%d}" % (NS.encode(), shard(key))
    score = r.cmd(b"ZSCORE", tag + b":d", key)
    return score is not None and float(score) > t + 86400000


def job_rec(jid, body=b"x", tube=b"default", state=0, pri=10, ttr=60,
            delay=0, due=0, created=None, owner=1, body_len=None):
    """A job record in job_write()'s layout (version 2)."""
    created = now_ms() if created is None else created
    return (b"J\x02" + bytes([state]) +
            struct.pack("<IIIQqq5IB", pri, ttr, delay, jid, due, created,
                        0, 0, 0, 0, 0, len(tube)) + tube +
            struct.pack("<I", len(body) if body_len is None else body_len) +
            body + struct.pack("<I", owner))


def live_rec(node, due):
    return b"L\x02" + struct.pack("<Iq", node, due)


def peek(c, jid):
    return c.cmd(b"peek %d\r\n" % jid)


def until(cond, what):
    end = time.monotonic() + BOUND
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    check(False, "not within %.0f s: %s" % (BOUND, what))


def alive(c):
    """stats answers, and a fresh job goes through put/reserve/delete."""
    check(yaml_map(c.cmd(b"stats\r\n")).get("pid"), "stats")
    jid = put_job(c, b"fresh", pri=0)
    r = c.cmd(b"reserve-with-timeout 0\r\n")
    check(r == b"RESERVED %d 5\r\nfresh\r\n" % jid, "reserve %r" % r)
    check(c.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n", "delete")


def unreadable_total(mport):
    """twheeld_store_unreadable_total from /metrics."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                                timeout=10) as f:
        for ln in f.read().decode().splitlines():
            if ln.startswith("twheeld_store_unreadable_total "):
                return int(float(ln.split()[1]))
    check(False, "no twheeld_store_unreadable_total in /metrics")


def session(rport):
    r = Resp(rport)
    mport = bstk.free_port()
    t = now_ms()
    # Before the start: records of node 1 that its recovery reads.
    bad = {}  # id -> what it is; none may be served
    own = NODE + 100
    plant(r, b"n1", t + 3600000, b"garbage")  # its own, unreadable
    plant(r, b"j%d" % own, NEVER, job_rec(own, b"legit", pri=0xFFFFFFFF,
                                         ttr=0))
    cases = [
        ("truncated", lambda i: job_rec(i)[:30]),
        ("too long", lambda i: job_rec(i) + b"tail"),
        ("body length field", lambda i: job_rec(i, body=b"abc", body_len=9)),
        ("unknown state", lambda i: job_rec(i, state=7)),
        ("tube bytes", lambda i: job_rec(i, tube=b"a b\r\nOK 9")),
        ("tube NUL", lambda i: job_rec(i, tube=b"ab\x00c")),
        ("tube dash", lambda i: job_rec(i, tube=b"-x")),
        ("created INT64_MIN", lambda i: job_rec(i, created=-(1 << 63))),
        ("due 2^62 ms", lambda i: job_rec(i, state=1, delay=1,
                                                due=(1 << 62))),
    ]
    for k, (what, make) in enumerate(cases):
        jid = NODE + 10 + k  # below own: never issued
        plant(r, b"j%d" % jid, NEVER, make(jid))
        bad[jid] = what
    # A key that names another id: the record is not that job's.
    other = NODE + 60
    plant(r, b"j%d" % (other - 1), NEVER, job_rec(other, b"other key"))
    bad[other] = "key of another id"
    bad[other - 1] = "key of another id"
    plant(r, b"jxyz", NEVER, job_rec(other + 1, b"no id"))
    bad[other + 1] = "key without an id"
    # Its high-water mark of ids, beyond its range: ids would wrap.
    plant(r, b"m1", NEVER, b"M\x02" + struct.pack("<Q", (1 << 64) - 1))
    # A job it holds, taken over from node 5 earlier (node 5's id): its
    # next ids stay in its own range.
    taken = 5 * NODE + 7
    plant(r, b"j%d" % taken, NEVER, job_rec(taken, b"taken", owner=1))
    for _ in range(2 * (len(cases) + 6)):
        r.read()
    # bstk.wait_port: up within 20 s, or the test fails.
    a = bstk.start_twheeld("--redis", "redis://127.0.0.1:%d" % rport,
                           "--namespace", NS, "--node", "1",
                           "--metrics-port", str(mport))
    c = Client(a.port)
    f = c.cmd(b"peek %d\r\n" % own)
    check(f == b"FOUND %d 5\r\nlegit\r\n" % own, "valid record: %r" % f)
    st = yaml_map(c.cmd(b"stats-job %d\r\n" % own))
    check(st["pri"] == "4294967295" and st["ttr"] == "1" and
          st["tube"] == "default", "valid record's fields %r" % st)
    for jid, what in bad.items():
        check(peek(c, jid) == b"NOT_FOUND\r\n", "served: " + what)
        check(c.cmd(b"stats-job %d\r\n" % jid) == b"NOT_FOUND\r\n",
              "stats-job of " + what)
    # Each skipped record is counted: n1 and the job records.
    n = unreadable_total(mport)
    check(n == 1 + len(cases) + 3, "unreadable at start-up: %d" % n)
    check(peek(c, taken) == b"FOUND %d 5\r\ntaken\r\n" % taken, "taken")
    check(c.cmd(b"delete %d\r\n" % taken) == b"DELETED\r\n", "delete")
    tubes = c.cmd(b"list-tubes\r\n")
    check(tubes == b"OK 14\r\n---\n- default\n\r\n", "tubes %r" % tubes)
    alive(c)

    # Running: this server's ready job, which nothing may take from it.
    mine = put_job(c, b"mine")
    check(own < mine < own + 1024, "id %d after recovery" % mine)
    nxt = mine + 1  # the next ids it issues
    t = now_ms()
    dead = 3 * NODE
    plant(r, b"j%d" % (dead + 1), NEVER,
          job_rec(dead + 1, b"dead-ready", owner=3))
    plant(r, b"j%d" % (dead + 2), NEVER,
          job_rec(dead + 2, b"dead-buried", state=3, owner=3))
    hostile3 = {
        dead + 3: job_rec(dead + 3, tube=b"sp ace", owner=3),
        dead + 4: job_rec(dead + 4, created=-(1 << 63), owner=3),
        dead + 5: job_rec(dead + 5, state=9, owner=3),
        dead + 6: job_rec(dead + 6, body=b"abc", body_len=2, owner=3),
        dead + 7: job_rec(dead + 9, owner=3),  # another id than its key
    }
    for jid, p in hostile3.items():
        plant(r, b"j%d" % jid, NEVER, p)
        bad[jid] = "node 3's hostile record"
    bad[dead + 9] = "node 3's record under another key"
    # A record of another node with an id this server issues next.
    plant(r, b"j%d" % (nxt + 2), t, job_rec(nxt + 2, b"squatter", owner=4))
    plant(r, b"n3", t - 1000, live_rec(3, t - 1000))
    junk = {
        b"n4": b"garbage",  # not a liveness record
        b"n5": live_rec(1, t - 1000),  # names this server
        b"n6": live_rec(6, 1 << 62),  # "alive" for ever, yet it fired
        b"nxyz": live_rec(7, t - 1000),  # no node in the key
        b"n": live_rec(0, t - 1000),
        b"n99999999999": live_rec(8, t - 1000),  # beyond 32 bits
    }
    for k, p in junk.items():
        plant(r, k, t - 1000, p)
    for _ in range(2 * (2 + len(hostile3) + 2 + len(junk))):
        r.read()
    # This server's next ids: none of them is the squatter's job, which
    # fired here before they are issued.
    until(lambda: rearmed(r, b"j%d" % (nxt + 2), t), "the squatter fired")
    for i in range(3):
        jid = put_job(c, b"next-%d" % i)
        check(jid == nxt + i, "id %d" % jid)
    f = peek(c, nxt + 2)
    check(f == b"FOUND %d 6\r\nnext-2\r\n" % (nxt + 2), "peek %r" % f)
    for i in range(3):
        check(c.cmd(b"delete %d\r\n" % (nxt + i)) == b"DELETED\r\n", "delete")
    check(peek(c, nxt + 2) == b"NOT_FOUND\r\n", "a second job %d" % (nxt + 2))

    # Node 3's valid jobs are taken over, its buried one buried.
    until(lambda: peek(c, dead + 1).startswith(b"FOUND") and
          peek(c, dead + 2).startswith(b"FOUND"), "takeover of node 3")
    check(yaml_map(c.cmd(b"stats-job %d\r\n" % (dead + 2)))["state"] ==
          "buried", "buried stays buried")
    check(c.cmd(b"kick-job %d\r\n" % (dead + 2)) == b"KICKED\r\n", "kick")
    got = set()
    for _ in range(3):
        r2 = c.cmd(b"reserve-with-timeout 0\r\n")
        if r2 == b"TIMED_OUT\r\n":
            break
        head, body = r2.split(b"\r\n")[:2]
        jid = int(head.split()[1])
        check(jid not in bad, "served %s: %r" % (bad.get(jid), r2))
        got.add((jid, body))
        check(c.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n", "delete")
    check(got == {(dead + 1, b"dead-ready"), (dead + 2, b"dead-buried"),
                  (mine, b"mine")}, "reserved %r" % got)
    for jid, what in bad.items():
        check(peek(c, jid) == b"NOT_FOUND\r\n", "served: %s" % what)
    # The liveness records it cannot use are gone, not fired for ever.
    until(lambda: not any(planted(r, k) for k in list(junk) + [b"n3"]),
          "unusable liveness records removed: %r" %
          [k for k in list(junk) + [b"n3"] if planted(r, k)])
    check(planted(r, b"n1"), "its own liveness record")
    n2 = unreadable_total(mport)
    check(n2 >= n + 1 + len(junk), "unreadable counted %d, %d" % (n, n2))
    alive(c)

    # Thousands of servers that never existed, all "dead" at once. A kick
    # of a delayed job (in the store: a query of the store's query thread,
    # which also runs the takeover scans) must not wait behind a scan per
    # fake server.
    kc = Client(a.port, timeout=60)
    check(kc.cmd(b"use slow\r\n") == b"USING slow\r\n", "use")
    slow = put_job(kc, b"slow", delay=3600)
    t = now_ms()
    fakes = [b"n%d" % (100000 + i) for i in range(FAKE_SERVERS)]
    for i, k in enumerate(fakes):
        plant(r, k, t, live_rec(100000 + i, t))
    for _ in range(2 * len(fakes)):
        r.read()
    t0 = time.monotonic()
    time.sleep(0.5)  # the first of them fire (the store polls)
    r2 = kc.cmd(b"kick 1\r\n")
    kick_s = time.monotonic() - t0
    check(r2 == b"KICKED 1\r\n", "kick %r" % r2)
    check(kc.cmd(b"delete %d\r\n" % slow) == b"DELETED\r\n", "delete")
    kc.close()
    worst = 0.0
    left = fakes
    while left and time.monotonic() - t0 < BOUND:
        t1 = time.monotonic()
        alive(c)
        worst = max(worst, time.monotonic() - t1)
        left = [k for k in left if planted(r, k)]
    check(not left, "%d of %d fake servers' records left after %.0f s" %
          (len(left), FAKE_SERVERS, BOUND))
    print("%d fake liveness records gone in %.1f s, slowest "
          "stats+put+reserve+delete %.3f s, kick of a delayed job %.1f s" %
          (FAKE_SERVERS, time.monotonic() - t0, worst, kick_s))
    check(kick_s < KICK_BOUND, "kick took %.1f s" % kick_s)
    check(worst < 2.0, "the server stalled %.1f s" % worst)
    alive(c)
    vanished(r, c)
    c.close()
    check(a.stop() == 0, "clean stop")


def vanished(r, c):
    """A ready job whose record disappears from Redis behind the server's
    back (someone else deleted it) is not handed out: its lease is a
    conditional write, refused, so RESERVED is taken back and the reserve
    waits on (TIMED_OUT), and the job is gone (peek NOT_FOUND). Before the
    fix the reply stood, and a refused reply left an empty one at the head
    of the output that stopped every later reply."""
    check(c.cmd(b"use vanish\r\n") == b"USING vanish\r\n", "use")
    check(c.cmd(b"watch vanish\r\n").startswith(b"WATCHING"), "watch")
    check(c.cmd(b"ignore default\r\n").startswith(b"WATCHING"), "ignore")
    jid = put_job(c, b"gone")
    key = b"j%d" % jid
    tag = b"{%s:%d}" % (NS.encode(), shard(key))
    check(r.cmd(b"HDEL", tag + b":p", key) == b"1", "HDEL of the record")
    r.cmd(b"ZREM", tag + b":d", key)
    got = c.cmd(b"reserve-with-timeout 1\r\n")
    check(got == b"TIMED_OUT\r\n", "reserve of a job whose record "
          "vanished: %r" % got)
    check(peek(c, jid) == b"NOT_FOUND\r\n", "peek of it")
    alive(c)
    print("a job whose record vanished: not handed out, gone")


def main():
    def fn(server):
        # with_redis's redis-server, the last one bstk started; twheeld
        # is started here, with --metrics-port.
        argv = bstk._redis[-1].args
        session(int(argv[argv.index("--port") + 1]))
    return with_redis(NS, fn)


if __name__ == "__main__":
    sys.exit(main())
