#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis: a server that was stopped (SIGSTOP) past its takeover
and comes back must not bring back jobs that another server took over and
deleted (finding 1 of the review: no fencing of a stale server's writes).
Two servers (--node 1 = A, --node 2 = B) on one namespace of a real
redis-server (started here on a free loopback port, killed at the end).
Through A: RESERVED jobs reserved by a worker connection (TTR 300 s, so
they stay reserved on A) and READY ready jobs. SIGSTOP of A; a client of
B polls `peek` until B has taken over every job (A's liveness record runs
out 10 s after its last renewal, plus shard moves: docs/guide/twheeld.md;
at most TAKEOVER_BOUND s) and deletes each through B (DELETED). Then:
  - half of A's worker commands (`bury` / `release` of its reserved jobs,
    alternately) are sent while A is still stopped (they wait in the
    socket), then SIGCONT, then the other half 0.5 s later;
  - a second worker on A asks for jobs (reserve-with-timeout 0) and
    releases any it gets;
  - `peek` of every job on A and B must answer NOT_FOUND: the jobs were
    deleted, and no server may serve them again;
  - both servers are killed with -9 and started again (same --node): no
    job is back on either.
Bar: 0 deleted jobs back anywhere (beanstalkd semantics: DELETED is
final). What A answers to its worker is printed, not checked.
Measured on the unfixed server: A answers BURIED / RELEASED and the jobs
are back on A, and again after the restart.
Skipped (77) without redis-server. About 20-30 s.
Usage: test_fencing.py --twheeld BINARY"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bstk  # noqa: E402
from bstk import Client, check, put_job, with_redis  # noqa: E402

RESERVED = 10
READY = 5
TAKEOVER_BOUND = 40.0
FAILS = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    FAILS.append(msg)


def found(c, ids):
    """The ids of @ids that `peek` finds through Client @c."""
    out = []
    for jid in ids:
        r = c.cmd(b"peek %d\r\n" % jid)
        if r.startswith(b"FOUND"):
            out.append(jid)
        elif r != b"NOT_FOUND\r\n":
            fail("peek %d: %r" % (jid, r))
    return out


def session(server):
    a, b = server(1), server(2)
    ca = Client(a.port)
    held = [put_job(ca, b"held-%d" % i, pri=1, ttr=300)
            for i in range(RESERVED)]
    ready = [put_job(ca, b"ready-%d" % i, pri=2, ttr=300)
             for i in range(READY)]
    w = Client(a.port, timeout=60)
    for jid in held:
        r = w.cmd(b"reserve-with-timeout 0\r\n")
        check(r.startswith(b"RESERVED %d " % jid), "reserve on A: %r" % r)
    w2 = Client(a.port, timeout=60)
    ids = held + ready
    a.proc.send_signal(signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        cb = Client(b.port, timeout=60)
        taken = set()
        while len(taken) < len(ids) and \
                time.monotonic() - t_stop < TAKEOVER_BOUND:
            taken |= set(found(cb, set(ids) - taken))
            if len(taken) < len(ids):
                time.sleep(0.5)
        t_taken = time.monotonic() - t_stop
        check(len(taken) == len(ids), "precondition: B took over %d of %d "
              "jobs of the stopped A within %.0f s" % (len(taken), len(ids),
                                                       TAKEOVER_BOUND))
        print("B took over A's %d jobs %.1f s after SIGSTOP" %
              (len(ids), t_taken))
        for jid in ids:
            r = cb.cmd(b"delete %d\r\n" % jid)
            check(r == b"DELETED\r\n", "delete %d on B: %r" % (jid, r))
        # Half of the worker's commands wait in A's socket meanwhile.
        cmds = [b"bury %d 0\r\n" % jid if i % 2 == 0 else
                b"release %d 0 0\r\n" % jid for i, jid in enumerate(held)]
        half = len(cmds) // 2
        w.send(b"".join(cmds[:half]))
    finally:
        a.proc.send_signal(signal.SIGCONT)
    # A may answer anything (NOT_FOUND is right), even close the
    # connection: only what exists afterwards is checked.
    answers = []
    try:
        for _ in range(half):
            answers.append(w.reply())
        time.sleep(0.5)
        for cmd in cmds[half:]:
            answers.append(w.cmd(cmd))
    except (OSError, EOFError) as e:
        answers += [b"<%s>" % type(e).__name__.encode()] * (
            len(cmds) - len(answers))
    print("A's answers to its worker after SIGCONT: %s" %
          ", ".join("%s %s" % (c.split()[0].decode(), a.strip().decode())
                    for c, a in zip(cmds, answers)))
    served = []
    try:
        for _ in range(2 * len(ids)):
            r = w2.cmd(b"reserve-with-timeout 0\r\n")
            if not r.startswith(b"RESERVED"):
                break
            served.append(int(r.split()[1]))
        for jid in served:
            w2.cmd(b"release %d 0 0\r\n" % jid)
    except (OSError, EOFError):
        pass
    if served:
        fail("A served %d jobs that B had taken over and deleted (%d of "
             "the %d reserved that its worker released, %d of the %d "
             "ready)" % (len(served), len(set(served) & set(held)),
                         RESERVED, len(set(served) & set(ready)), READY))
    time.sleep(1.0)  # whatever A writes, in Redis by now
    if a.proc.poll() is None:
        ca = Client(a.port)
        back_a = found(ca, ids)
    else:  # a server may well stop once it finds it was taken over
        print("A exited (%s) after SIGCONT" % a.proc.returncode)
        ca, back_a = None, []
    back_b = found(cb, ids)
    if back_a or back_b:
        fail("after SIGCONT and A's worker's bury/release: %d deleted jobs "
             "on A (%d of the %d reserved, %d of the %d ready), %d on B" %
             (len(back_a), len(set(back_a) & set(held)), RESERVED,
              len(set(back_a) & set(ready)), READY, len(back_b)))
    for c in (ca, cb, w, w2):
        if c:
            c.close()
    a.kill9()
    b.kill9()
    a, b = server(1), server(2)
    ca, cb = Client(a.port), Client(b.port)
    back_a, back_b = found(ca, ids), found(cb, ids)
    if back_a or back_b:
        fail("after kill -9 and restart of both: %d deleted jobs back on A "
             "(%d of the %d reserved, %d of the %d ready), %d on B: %r" %
             (len(back_a), len(set(back_a) & set(held)), RESERVED,
              len(set(back_a) & set(ready)), READY, len(back_b),
              sorted(back_a + back_b)))
    ca.close()
    cb.close()
    a.stop()
    b.stop()
    check(not FAILS, "%d checks failed: deleted jobs came back" % len(FAILS))


def short_pause(server):
    """A pause shorter than the liveness record (6.5 s) past the lease of
    jobs reserved with a TTR of 3 s (due TTR + 2 s): the owner of their
    shard takes them (B), a worker there deletes each; A, continued, must
    deliver none of them (a reserve is answered TIMED_OUT), and a delete
    queued on A for each answers NOT_FOUND (B deleted it, not A's worker).
    Measured before the fix: A delivered deleted jobs, and its deletes
    answered DELETED (its writes passed the fence: every server issued the
    same write tokens)."""
    a, b = server(3), server(4)
    ca = Client(a.port, timeout=60)
    n = 8
    ids = [put_job(ca, b"short-%d" % i, ttr=3) for i in range(n)]
    for jid in ids:
        r = ca.cmd(b"reserve-job %d\r\n" % jid)
        check(r.startswith(b"RESERVED"), "reserve-job on A: %r" % r)
    w = Client(a.port, timeout=60)
    a.proc.send_signal(signal.SIGSTOP)
    deleted = set()
    try:
        cb = Client(b.port, timeout=60)
        end = time.monotonic() + 6.5
        while time.monotonic() < end:
            r = cb.cmd(b"reserve-with-timeout 0\r\n")
            if r.startswith(b"RESERVED") and int(r.split()[1]) in ids:
                jid = int(r.split()[1])
                if cb.cmd(b"delete %d\r\n" % jid) == b"DELETED\r\n":
                    deleted.add(jid)
            else:
                time.sleep(0.05)
        check(deleted, "precondition: B took and deleted some of A's jobs "
              "within 6.5 s (lease 3 + 2 s)")
        ca.send(b"".join(b"delete %d\r\n" % jid for jid in sorted(deleted)))
        w.send(b"reserve-with-timeout 0\r\n" * n)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    dels = [ca.reply() for _ in deleted]
    served = [int(r.split()[1]) for r in (w.reply() for _ in range(n))
              if r.startswith(b"RESERVED")]
    again = sorted(set(served) & deleted)
    print("short pause: B deleted %d of A's %d jobs; A then delivered %d "
          "of them, its deletes answered %s" %
          (len(deleted), n, len(again),
           sorted(set(r.strip().decode() for r in dels))))
    if again:
        fail("A delivered %d jobs B had deleted" % len(again))
    if any(r != b"NOT_FOUND\r\n" for r in dels):
        fail("A's deletes of jobs B deleted: %r" % dels)
    for c in (ca, cb, w):
        c.close()
    a.stop()
    b.stop()
    check(not FAILS, "%d checks failed" % len(FAILS))


def both(server):
    session(server)
    short_pause(server)


def main():
    # A server started again whose liveness record ran out waits for the
    # takeover to finish, at most 30 s (docs/guide/twheeld.md), before it
    # listens: more than bstk.wait_port()'s 20 s.
    wait = bstk.wait_port
    bstk.wait_port = lambda port, proc, timeout=45.0: wait(port, proc,
                                                           timeout)
    return with_redis("fencing", both)


if __name__ == "__main__":
    sys.exit(main())
