#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld with -b: jobs survive kill -9 in the right state.
Both with -f 0 and with -f 200.
1. One job in each state, kill -9, restart: ready stays ready, delayed keeps
   its due time, reserved comes back ready, buried stays buried, deleted
   stays gone, ids are not reused (also after every job was deleted).
2. Many connections put, delete, reserve and bury at full speed; kill -9
   in the middle; after the restart every job whose INSERTED reached a
   client is there in the state its last acknowledged command left it in,
   and no job whose DELETED reached a client comes back.
3. 100,000 delayed jobs cost at most DELAYED_MAX_BYTES of resident memory
   each (the store holds them; twheeld keeps a count), and one of them
   is peeked at, kicked, reserved and deleted; kick 3 kicks three.
Usage: test_durable.py --twheeld PATH"""
import os
import shutil
import sys
import threading
import time

from bstk import Client, check, sanitized, start_twheeld, tempdir, yaml_map


def put(c, body, pri=10, delay=0, ttr=60):
    r = c.cmd(b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body),
                                              body))
    check(r.startswith(b"INSERTED "), "put: %r" % r)
    return int(r.split()[1])


def job_state(c, jid):
    r = c.cmd(b"stats-job %d\r\n" % jid)
    if r == b"NOT_FOUND\r\n":
        return None
    return yaml_map(r)


def states(d, fl):
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    a = put(c, b"ready")
    b = put(c, b"delayed long", delay=3600)
    e = put(c, b"to reserve")
    f = put(c, b"to delete")
    g = put(c, b"to bury")
    h = put(c, b"delayed short", delay=1)
    check(c.cmd(b"delete %d\r\n" % f) == b"DELETED\r\n", "delete")
    w = Client(s.port)
    # Reserve a, e and g (pri 10, by id); bury g; release a delayed.
    for want in (a, e, g):
        r = w.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED %d " % want), "reserve %r" % r)
    check(w.cmd(b"bury %d 7\r\n" % g) == b"BURIED\r\n", "bury")
    check(w.cmd(b"release %d 3 3600\r\n" % a) == b"RELEASED\r\n", "release")
    body = os.urandom(3000).replace(b"\r\n", b"xx")
    big = put(c, body, pri=4294967295)
    s.kill9()
    time.sleep(1.2)  # h's delay passes while the server is down
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    want = {a: ("delayed", "3"), b: ("delayed", "10"), e: ("ready", "10"),
            g: ("buried", "7"), h: ("ready", "10"),
            big: ("ready", "4294967295")}
    for jid, (st, pri) in want.items():
        m = job_state(c, jid)
        check(m is not None, "job %d is back" % jid)
        check(m["state"] == st and m["pri"] == pri,
              "job %d: %s/%s, want %s/%s" % (jid, m["state"], m["pri"], st,
                                              pri))
    check(job_state(c, f) is None, "deleted job %d stays deleted" % f)
    tl = int(job_state(c, b)["time-left"])
    check(3590 <= tl <= 3600, "delayed job keeps its due time: %d" % tl)
    r = c.cmd(b"peek %d\r\n" % big)
    check(r == b"FOUND %d %d\r\n%s\r\n" % (big, len(body), body), "body")
    # Delete everything; ids still go on after a restart.
    for jid in want:
        check(c.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n", "delete all")
    s.kill9()
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    nid = put(c, b"new")
    check(nid > big, "id %d not reused (last %d)" % (nid, big))
    check(c.cmd(b"stats-job %d\r\n" % a) == b"NOT_FOUND\r\n", "gone")
    c.close()
    check(s.stop() == 0, "clean stop")
    print("states -f %s: ok" % fl)


def bodies(d, fl):
    """Delayed and buried jobs keep their bodies in the store only: every
    way a body comes back (peek, peek-delayed, peek-buried, the delay
    running out, kick, kick-job), before and after a restart, gives it
    back byte for byte."""
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    c.cmd(b"use b\r\n")
    c.cmd(b"watch b\r\n")
    c.cmd(b"ignore default\r\n")
    bd = {}

    def body(k):
        return (b"%s-" % k) + os.urandom(40).replace(b"\r\n", b"xx")

    for k in (b"d-long", b"d-short", b"bury", b"kick", b"kickjob"):
        bd[k] = body(k)
    ids = {b"d-long": put(c, bd[b"d-long"], delay=3600),
           b"d-short": put(c, bd[b"d-short"], delay=1)}
    for k in (b"bury", b"kick", b"kickjob"):
        ids[k] = put(c, bd[k], pri=20)
        r = c.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED %d " % ids[k]), "reserve %r" % r)
        check(c.cmd(b"bury %d 1\r\n" % ids[k]) == b"BURIED\r\n", "bury")

    def found(cmd, k):
        r = c.cmd(cmd)
        want = b"FOUND %d %d\r\n%s\r\n" % (ids[k], len(bd[k]), bd[k])
        check(r == want, "%r: %r, want %r" % (cmd, r, want))

    for k in ids:
        found(b"peek %d\r\n" % ids[k], k)
    found(b"peek-buried\r\n", b"bury")
    s.kill9()
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    c.cmd(b"use b\r\n")
    c.cmd(b"watch b\r\n")
    c.cmd(b"ignore default\r\n")
    # d-short's delay (1 s) runs out: ready, with its body.
    r = c.cmd(b"reserve-with-timeout 5\r\n")
    check(r == b"RESERVED %d %d\r\n%s\r\n" % (ids[b"d-short"],
                                               len(bd[b"d-short"]),
                                               bd[b"d-short"]), "d-short")
    check(c.cmd(b"delete %d\r\n" % ids[b"d-short"]) == b"DELETED\r\n", "del")
    del ids[b"d-short"]
    for k in ids:
        found(b"peek %d\r\n" % ids[k], k)
    found(b"peek-delayed\r\n", b"d-long")
    found(b"peek-buried\r\n", b"bury")
    check(c.cmd(b"kick-job %d\r\n" % ids[b"kickjob"]) == b"KICKED\r\n",
          "kick-job")
    check(c.cmd(b"kick 10\r\n") == b"KICKED 2\r\n", "kick")
    got = set()
    for _ in range(3):
        r = c.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED "), "reserve %r" % r)
        jid = int(r.split()[1])
        k = [k for k in ids if ids[k] == jid][0]
        check(r.endswith(b" %d\r\n%s\r\n" % (len(bd[k]), bd[k])),
              "body of %r" % k)
        got.add(k)
    check(got == {b"bury", b"kick", b"kickjob"}, "kicked %r" % got)
    # A delay that runs out while the server is up: a short one.
    jid = put(c, b"soon", delay=1)
    ids[b"soon"], bd[b"soon"] = jid, b"soon"
    r = c.cmd(b"reserve-with-timeout 5\r\n")
    check(r == b"RESERVED %d 4\r\nsoon\r\n" % jid, "soon: %r" % r)
    c.close()
    check(s.stop() == 0, "clean stop")
    print("bodies -f %s: ok" % fl)


class Load(threading.Thread):
    """One connection: put; then delete, bury or leave, as ids say."""

    def __init__(self, port, k, stop):
        super().__init__(daemon=True)
        self.port, self.k, self.stop = port, k, stop
        # id -> acknowledged state; "unknown:<a>|<b>" when the last command
        # was sent and its answer never came.
        self.acked = {}
        self.deleted = set()

    def run(self):
        try:
            c = Client(self.port)
            c.cmd(b"use load%d\r\n" % (self.k % 4))
            c.cmd(b"watch load%d\r\n" % (self.k % 4))
            n = 0
            while not self.stop.is_set():
                n += 1
                delay = 3600 if n % 5 == 0 else 0
                body = b"%d-%d" % (self.k, n)
                c.send(b"put 5 %d 60 %d\r\n%s\r\n" % (delay, len(body), body))
                r = c.reply()
                jid = int(r.split()[1])
                self.acked[jid] = "delayed" if delay else "ready"
                if delay:
                    continue
                if n % 3 == 0:
                    self.acked[jid] = "ready|gone"
                    r = c.cmd(b"delete %d\r\n" % jid)
                    check(r == b"DELETED\r\n", "delete %r" % r)
                    del self.acked[jid]
                    self.deleted.add(jid)
                elif n % 3 == 1:
                    r = c.cmd(b"reserve-job %d\r\n" % jid)
                    if not r.startswith(b"RESERVED"):
                        continue  # another connection has it
                    self.acked[jid] = "ready|buried"
                    r = c.cmd(b"bury %d 5\r\n" % jid)
                    check(r == b"BURIED\r\n", "bury %r" % r)
                    self.acked[jid] = "buried"
        except (OSError, EOFError):
            pass  # the server was killed


def load(d, fl, conns=32, seconds=2.0):
    s = start_twheeld("-b", d, "-f", fl)
    stop = threading.Event()
    ts = [Load(s.port, k, stop) for k in range(conns)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    s.kill9()
    stop.set()
    for t in ts:
        t.join(10)
    s = start_twheeld("-b", d, "-f", fl)
    c = Client(s.port)
    checked = 0
    maxid = 0
    for t in ts:
        for jid, want in t.acked.items():
            m = job_state(c, jid)
            got = m["state"] if m else "gone"
            check(got in want.split("|"),
                  "job %d: %s after restart, acknowledged %s" % (jid, got,
                                                                want))
            checked += 1
            maxid = max(maxid, jid)
        for jid in t.deleted:
            check(job_state(c, jid) is None, "deleted job %d came back" % jid)
            maxid = max(maxid, jid)
    check(checked > 100, "load made %d jobs" % checked)
    nid = put(c, b"after")
    check(nid > maxid, "id %d after restart, max before %d" % (nid, maxid))
    c.close()
    check(s.stop() == 0, "clean stop")
    print("load -f %s: %d acknowledged jobs and %d deletes checked after "
          "kill -9" % (fl, checked, sum(len(t.deleted) for t in ts)))


# Delayed jobs held by the store alone: what one costs in twheeld's
# resident memory. The journal's index entry is about 68 bytes; twheeld
# kept 168 more (its job, timer, lists and table) before delayed jobs
# lived in the store only.
DELAYED_JOBS = 100000
DELAYED_MAX_BYTES = 120


def delayed_memory(d):
    s = start_twheeld("-b", d, "-f", "200")
    c = Client(s.port)
    put(c, b"warm-up", delay=7200)
    before = s.rss_kb()
    batch = 1000
    for i in range(0, DELAYED_JOBS, batch):
        c.send(b"".join(b"put 10 %d 60 16\r\nbody-%011d\r\n" %
                        (3600 + j % 600, i + j) for j in range(batch)))
        for _ in range(batch):
            ln = c.line()
            check(ln.startswith(b"INSERTED "), "put: %r" % ln)
    st = yaml_map(c.cmd(b"stats\r\n"))
    check(st["current-jobs-delayed"] == str(DELAYED_JOBS + 1), "delayed")
    per_job = (s.rss_kb() - before) * 1024.0 / DELAYED_JOBS
    if not sanitized():  # a sanitizer's shadow memory is not the server's
        check(per_job <= DELAYED_MAX_BYTES, "%.0f bytes of resident memory "
              "a delayed job (at most %d)" % (per_job, DELAYED_MAX_BYTES))
    # peek-delayed: the one due first, known from the puts (id 2, the
    # first of delay 3600); then one due earlier; once that one is
    # deleted, id 2 again (from the store's query thread).
    first = b"FOUND 2 16\r\nbody-00000000000\r\n"
    check(c.cmd(b"peek-delayed\r\n") == first, "peek-delayed")
    early = put(c, b"early", delay=100)
    r = c.cmd(b"peek-delayed\r\n")
    check(r == b"FOUND %d 5\r\nearly\r\n" % early, "peek-delayed %r" % r)
    check(c.cmd(b"delete %d\r\n" % early) == b"DELETED\r\n", "delete")
    check(c.cmd(b"peek-delayed\r\n") == first, "peek-delayed after delete")
    # One of them, read back from the store in every way.
    jid = 2
    m = yaml_map(c.cmd(b"stats-job %d\r\n" % jid))
    check(m["state"] == "delayed" and int(m["time-left"]) > 3000, "%r" % m)
    check(c.cmd(b"kick-job %d\r\n" % jid) == b"KICKED\r\n", "kick-job")
    r = c.cmd(b"reserve-with-timeout 0\r\n")
    check(r.startswith(b"RESERVED %d 16" % jid), "reserve %r" % r)
    check(c.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n", "delete")
    # kick: the three due first (no buried job in the tube).
    check(c.cmd(b"kick 3\r\n") == b"KICKED 3\r\n", "kick 3")
    st = yaml_map(c.cmd(b"stats\r\n"))
    check(st["current-jobs-ready"] == "3" and
          st["current-jobs-delayed"] == str(DELAYED_JOBS - 3), "%r" % st)
    c.close()
    check(s.stop() == 0, "clean stop")
    print("delayed jobs: %.0f bytes of resident memory each (%d jobs)" %
          (per_job, DELAYED_JOBS))


def main():
    d = tempdir()
    try:
        # -f 0: writes on the writer thread, replies after the fdatasync;
        # -f 200: writes on the event loop, replies after the write(2).
        # Both must survive kill -9 of the process.
        for f in ("0", "200"):
            states(os.path.join(d, "states" + f), f)
            bodies(os.path.join(d, "bodies" + f), f)
            load(os.path.join(d, "load" + f), f)
        delayed_memory(os.path.join(d, "memory"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
