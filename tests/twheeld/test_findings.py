#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Findings of an adversarial review of twheeld (beanstalkd 1.12 is the
reference): one case per finding, each run on its own (--case NAME, one
ctest test each, twheeld_f_NAME). Where beanstalkd's behaviour is the bar,
the same input goes to a real beanstalkd started beside twheeld and the
replies must be the same; where the bar is "beanstalkd never answers
NOT_FOUND for a job that exists", the case checks that directly (and,
where cheap, shows beanstalkd passes the same check).

Cases (finding number of the review in brackets):
  pipelined_delayed  [2] -b -f 0: a command pipelined in the same write
                     behind a delayed put / release (delete, peek,
                     stats-job, kick-job) must find the job; another
                     connection that saw the put counted (stats) must
                     find it too.
  delete_at_due      [3] -b: deletes of delayed jobs sent around their due
                     time: every one DELETED, none delivered afterwards.
  long_lines         [4] over-long lines, pipelined, split, in one write:
                     the same reply sequence as beanstalkd.
  reserve_order      [5] replies in order behind a waiting
                     reserve-with-timeout (memory and -b).
  kick_pipelined     [5] -b: a command pipelined behind a kick of delayed
                     jobs sees the kick done.
  half_close         [5] put then shutdown(SHUT_WR): beanstalkd answers
                     INSERTED; so must twheeld (memory, -b, -b -f 0).
  delayed_count      [5] -b: after kill -9 and restart, with jobs falling
                     due meanwhile: stats counts every acknowledged job
                     and stats-job finds each.
  kick_due_order     [6] memory: kick N of delayed jobs kicks the N due
                     first, as beanstalkd.
  time_left          [6] time-left / pause-time-left right after a change
                     read as beanstalkd's.
  crlf_id            [6] a put refused with EXPECTED_CRLF uses up an id,
                     as in beanstalkd.
  never_early        -b, -b -f 0: a delayed job is never reserved before
                     its delay has passed since the put was sent.
Skipped (77) without beanstalkd where it compares with it.
Usage: test_findings.py --twheeld PATH [--twheel PATH] --case NAME"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bstk import (SKIP, Client, have_beanstalkd, start_beanstalkd,  # noqa
                  start_twheeld, tempdir, yaml_map)

FAILS = []


def fail(msg):
    print("FAIL:", msg, flush=True)
    FAILS.append(msg)


def need_beanstalkd():
    if not have_beanstalkd():
        print("SKIP: beanstalkd is not installed")
        sys.exit(SKIP)


def put_cmd(body, pri=10, delay=0, ttr=60):
    return b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body), body)


def arg(name):
    """The value after @name on the command line, None without it."""
    for i, a in enumerate(sys.argv[:-1]):
        if a == name:
            return sys.argv[i + 1]
    return None


def put(c, body, pri=10, delay=0, ttr=60):
    r = c.cmd(put_cmd(body, pri, delay, ttr))
    if not r.startswith(b"INSERTED "):
        fail("put: %r" % r)
        raise SystemExit(1)
    return int(r.split()[1])


def raw_exchange(port, data, chunk=0, pause=0.002, quiet=0.4, until=None,
                 total=10.0):
    """Sends @data on a fresh connection (in one write, or in pieces of
    @chunk bytes with @pause between them, TCP_NODELAY) and reads every
    byte that comes back until @until is at the end of what was read, the
    peer closes, or nothing came for @quiet s (at most @total s)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if chunk:
        for i in range(0, len(data), chunk):
            s.sendall(data[i:i + chunk])
            time.sleep(pause)
    else:
        s.sendall(data)
    buf = b""
    end = time.monotonic() + total
    s.settimeout(quiet)
    try:
        while time.monotonic() < end:
            if until is not None and buf.endswith(until):
                break
            d = s.recv(65536)
            if not d:
                buf += b"<EOF>"
                break
            buf += d
    except socket.timeout:
        pass
    except ConnectionResetError:
        buf += b"<RST>"
    s.close()
    return buf


def both(fn, servers):
    """fn(server) on each server at once; the results in order."""
    with ThreadPoolExecutor(max_workers=len(servers)) as ex:
        return [f.result() for f in [ex.submit(fn, s) for s in servers]]


@contextmanager
def servers(*kinds):
    """Servers side by side, one of each kind in @kinds ("twheeld", with
    its flags: "twheeld -b" and "twheeld -b -f 0" with a store in a fresh
    directory each; "beanstalkd", which the case then needs: skipped
    without it). Yields them in order; at the end stops them all and
    removes their directories, also on failure."""
    if "beanstalkd" in kinds:
        need_beanstalkd()
    started, dirs = [], []
    try:
        for kind in kinds:
            if kind == "beanstalkd":
                started.append(start_beanstalkd())
                continue
            args = kind.split()[1:]
            if "-b" in args:
                dirs.append(tempdir())
                args.insert(args.index("-b") + 1, dirs[-1])
            started.append(start_twheeld(*args))
            started[-1].dir = dirs[-1] if "-b" in args else None
        yield started
    finally:
        for s in started:
            s.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def side_by_side(fn, *kinds):
    """fn(server) on servers of @kinds (servers()) at once; the results
    in order."""
    with servers(*kinds) as ss:
        return both(fn, ss)


def summary(buf):
    """A reply stream as 'N x LINE' runs, for messages."""
    out, prev, n = [], None, 0
    for ln in buf.replace(b"\n", b"\\n").split(b"\r\\n"):
        if ln == prev:
            n += 1
            continue
        if prev is not None:
            out.append("%d x %s" % (n, prev.decode(errors="replace")[:40]))
        prev, n = ln, 1
    if prev:
        out.append("%d x %s" % (n, prev.decode(errors="replace")[:40]))
    return ", ".join(out)


# ---- finding 2 ----

def pipelined_delayed():
    """twheeld -b -f 0 (the store's write takes an fdatasync: the widest
    window). For each command X in delete, peek, stats-job, kick-job,
    ROUNDS times: `put` of a job delayed 30 s and `X <its id>` in one
    write(); and a reserved job's `release <id> 0 30` and `X <id>` in one
    write. beanstalkd finds the job every time (shown on a real one with
    the same rounds). Then another connection, pipelining `stats` and
    `stats-job <id>` pairs while the put is under way: once stats counts
    the put (cmd-put), stats-job must find the job."""
    ROUNDS = 10
    want = {b"delete": b"DELETED", b"peek": b"FOUND", b"stats-job": b"OK",
            b"kick-job": b"KICKED"}

    def rounds(server):
        c = Client(server.port)
        bad = []
        n = 0
        for cmd in want:
            for r in range(ROUNDS):
                for how in ("put", "release"):
                    if how == "put":
                        jid = put(c, b"probe", delay=0)
                        c.cmd(b"delete %d\r\n" % jid)
                        jid += 1
                        c.send(put_cmd(b"x", delay=30) +
                               b"%s %d\r\n" % (cmd, jid))
                        first = c.reply()
                        if first != b"INSERTED %d\r\n" % jid:
                            bad.append("put: %r" % first)
                            continue
                    else:
                        jid = put(c, b"y", pri=0)
                        rr = c.cmd(b"reserve-job %d\r\n" % jid)
                        if not rr.startswith(b"RESERVED"):
                            bad.append("reserve-job: %r" % rr)
                            continue
                        c.send(b"release %d 0 30\r\n%s %d\r\n" %
                               (jid, cmd, jid))
                        first = c.reply()
                        if first != b"RELEASED\r\n":
                            bad.append("release: %r" % first)
                            continue
                    second = c.reply()
                    n += 1
                    if not second.startswith(want[cmd]):
                        bad.append("%s %s %d: %r" % (how, cmd.decode(), jid,
                                                     second[:30]))
                    # Leave nothing delayed behind.
                    c.cmd(b"delete %d\r\n" % jid)
        c.close()
        return n, bad

    def watcher(server):
        a, b = Client(server.port), Client(server.port)
        bad = []
        checked = 0
        for r in range(ROUNDS * 2):
            jid = put(a, b"probe")
            a.cmd(b"delete %d\r\n" % jid)
            puts = int(yaml_map(b.cmd(b"stats\r\n"))["cmd-put"])
            jid += 1
            a.send(put_cmd(b"w", delay=30))
            b.send(b"stats\r\nstats-job %d\r\n" % jid * 20)
            for _ in range(20):
                st = yaml_map(b.reply())
                sj = b.reply()
                if int(st["cmd-put"]) > puts:
                    checked += 1
                    if sj == b"NOT_FOUND\r\n":
                        bad.append("stats-job %d after the put counted" %
                                   jid)
            ins = a.reply()
            if ins != b"INSERTED %d\r\n" % jid:
                bad.append("put: %r" % ins)
            a.cmd(b"delete %d\r\n" % jid)
        a.close()
        b.close()
        return checked, bad

    with servers("twheeld -b -f 0", "beanstalkd") as ss:
        res = both(rounds, ss)
        wres = both(watcher, ss)
    for s, (n, bad), (wn, wbad) in zip(ss, res, wres):
        print("%s: %d pipelined commands, %d NOT the job's reply; another "
              "connection: %d stats-job after the put counted, %d "
              "NOT_FOUND" % (s.name, n, len(bad), wn, len(wbad)))
        for b in bad[:8]:
            print("   ", b)
        for b in wbad[:3]:
            print("   ", b)
    if res[1][1] or wres[1][1]:
        fail("beanstalkd itself does not find the job: the case is wrong")
    if res[0][1]:
        fail("twheeld -b: %d of %d commands pipelined behind a delayed "
             "put/release answered for a missing job (first: %s)" %
             (len(res[0][1]), res[0][0], res[0][1][0]))
    if wres[0][1]:
        fail("twheeld -b: another connection's stats-job answered NOT_FOUND "
             "%d times after stats counted the put" % len(wres[0][1]))


# ---- finding 3 ----

def wait_until(t):
    """Until time.monotonic() >= @t: sleeps, then spins the last 2 ms."""
    left = t - time.monotonic()
    if left > 0.002:
        time.sleep(left - 0.002)
    while time.monotonic() < t:
        pass


def delete_at_due():
    """twheeld -b: deletes of delayed jobs (delay 1 s) sent around their
    due time. No one reserves them, so each exists until deleted:
    beanstalkd answers DELETED to every one. After the deletes a
    reserve-with-timeout 1 loop must get none of them (a job answered
    NOT_FOUND that is delivered is the harm).
    To hit the moment reliably (a window of about a millisecond around
    the due time): ROUNDS rounds of JOBS puts, GAP apart, one at a time;
    then each job's delete is sent at the time its put was sent + 1 s +
    an offset from -2 ms to +5.5 ms (the offsets cycle job by job), one
    at a time. Then one round as the review did it: JOBS puts at full
    speed, then all deletes in one write at the first put + 1 s. About
    10 s. Measured on the unfixed server: 45-54 of 400 NOT_FOUND a timed
    round (mostly at offsets -0.5 to +0.5 ms), each then delivered; 0-54
    in the pipelined round."""
    JOBS = 400
    GAP = 0.0025
    ROUNDS = 2
    total_nf, delivered, total = 0, 0, 0
    with servers("twheeld -b") as (s,):
        c = Client(s.port, timeout=30)
        for rnd in range(ROUNDS + 1):
            timed = rnd < ROUNDS
            c.cmd(b"use due%d\r\n" % rnd)
            c.cmd(b"watch due%d\r\n" % rnd)
            c.cmd(b"ignore %s\r\n" % (b"default" if rnd == 0 else
                                      b"due%d" % (rnd - 1)))
            sent = []
            t0 = time.monotonic()
            for i in range(JOBS):
                if timed:
                    wait_until(t0 + i * GAP)
                t = time.monotonic()
                sent.append((put(c, b"d%d" % i, delay=1), t))
            nf = []
            if timed:
                for i, (jid, t) in enumerate(sent):
                    off = (i % 16) * 0.0005 - 0.002
                    wait_until(t + 1.0 + off)
                    r = c.cmd(b"delete %d\r\n" % jid)
                    if r == b"NOT_FOUND\r\n":
                        nf.append(jid)
                    elif r != b"DELETED\r\n":
                        fail("delete %d: %r" % (jid, r))
            else:
                wait_until(sent[0][1] + 1.0)
                c.send(b"".join(b"delete %d\r\n" % jid for jid, _ in sent))
                for jid, _ in sent:
                    r = c.reply()
                    if r == b"NOT_FOUND\r\n":
                        nf.append(jid)
                    elif r != b"DELETED\r\n":
                        fail("delete %d: %r" % (jid, r))
            got = []
            while True:
                r = c.cmd(b"reserve-with-timeout 1\r\n")
                if not r.startswith(b"RESERVED"):
                    break
                jid = int(r.split()[1])
                got.append(jid)
                c.cmd(b"delete %d\r\n" % jid)
            back = set(got) & set(nf)
            print("round %d (%s): %d NOT_FOUND of %d deletes, %d of those "
                  "jobs delivered afterwards" %
                  (rnd, "each delete at its due time -2..+5.5 ms" if timed
                   else "pipelined at the first due time", len(nf), JOBS,
                   len(back)), flush=True)
            total_nf += len(nf)
            delivered += len(back)
            total += JOBS
            other = set(got) - set(nf)
            if other:
                fail("jobs answered DELETED delivered: %r" % sorted(other)[:5])
        c.close()
    if total_nf:
        fail("twheeld -b: %d of %d deletes of existing delayed jobs around "
             "their due time answered NOT_FOUND; %d of those jobs were then "
             "delivered by reserve" % (total_nf, total, delivered))


# ---- finding 4 ----

END = b"list-tube-used\r\n"
L = b"x" * 300 + b"\r\n"
LONG_INPUTS = [
    ("300-byte line + command", L + END),
    ("100 300-byte lines + command", L * 100 + END),
    ("100 long put lines + command",
     (b"put " + b"1" * 250 + b"\r\n") * 100 + END),
    ("3 long lines between commands",
     END + L + b"stats-tube default\r\n" + L + L + END),
    ("long line, 224 bytes + CRLF", b"y" * 224 + b"\r\n" + END),
    ("line of 224 bytes with CRLF", b"y" * 222 + b"\r\n" + END),
    ("long line of 1000 bytes", b"z" * 1000 + b"\r\n" + END),
    ("long use", b"use " + b"t" * 250 + b"\r\n" + END),
    ("long line then put", L + put_cmd(b"after") + b"peek-ready\r\n" + END),
]
# Not compared: an over-long line whose '\r' of CRLF is its 224th byte,
# or that holds a lone '\r': beanstalkd 1.12 itself loses the line's end
# there (its scan_line_end() looks at the first '\r' of its buffer only)
# and answers nothing more on the connection.


def long_lines():
    """Each input of LONG_INPUTS, on fresh connections to twheeld and to a
    real beanstalkd at once: in one write, and split in pieces of 1 (short
    inputs only), 7, 100, 223 and 225 bytes (2 ms apart, TCP_NODELAY). The
    byte streams of replies must be identical, up to the reply of a
    `use zz-end` sent last (ids of INSERTED and FOUND aside). Measured on
    the unfixed server: 100 long lines + list-tube-used in one write gave
    2 (or 63) BAD_FORMAT and no USING; beanstalkd 100 BAD_FORMAT and
    USING."""
    bad = 0
    n = 0
    with servers("twheeld", "beanstalkd") as ss:
        for name, data in LONG_INPUTS:
            for chunk in (0, 1, 7, 100, 223, 225):
                if chunk == 1 and len(data) > 700:
                    continue
                if chunk and len(data) // chunk > 400:
                    continue
                n += 1
                # Each input ends with `use zz-end`: its USING is the last
                # reply (until then, a reply may be late, not missing).
                tw, bs = both(lambda s: raw_exchange(
                    s.port, data + b"use zz-end\r\n", chunk,
                    until=b"USING zz-end\r\n"), ss)
                tw, bs = (re.sub(rb"(INSERTED|FOUND) \d+", rb"\1 <id>", x)
                          for x in (tw, bs))
                if tw != bs:
                    bad += 1
                    fail("%s (%s): twheeld [%s], beanstalkd [%s]" %
                         (name, "one write" if not chunk else
                          "%d-byte pieces" % chunk, summary(tw),
                          summary(bs)))
    print("%d of %d exchanges differ from beanstalkd" % (bad, n))


# ---- finding 5 ----

def reserve_order():
    """`reserve-with-timeout 1` that has to wait, with commands pipelined
    behind it in the same write: beanstalkd answers them in order
    (TIMED_OUT, then USING, ...); so must twheeld, in memory and with -b.
    Also a job put by another connection while the reserve waits: RESERVED
    first."""
    def run(s):
        out = []
        out.append(raw_exchange(
            s.port, b"reserve-with-timeout 1\r\nlist-tube-used\r\n"
            b"stats-tube default\r\nlist-tubes-watched\r\n", quiet=2.5,
            until=b"- default\r\n"))
        c = Client(s.port)
        p = Client(s.port)
        c.send(b"watch w\r\nignore default\r\nreserve-with-timeout 5\r\n"
               b"use other\r\nlist-tube-used\r\n")
        time.sleep(0.3)
        p.cmd(b"use w\r\n")
        jid = put(p, b"job")
        buf = b""
        c.s.settimeout(3)
        try:
            while buf.count(b"\r\n") < 6:
                d = c.s.recv(4096)
                if not d:
                    break
                buf += d
        except socket.timeout:
            pass
        out.append(buf.replace(b"RESERVED %d " % jid, b"RESERVED <id> "))
        c.close()
        p.close()
        return out

    res = side_by_side(run, "twheeld", "twheeld -b", "beanstalkd")

    def heads(buf):
        """The replies' lines, a YAML body as <yaml> (the order is the
        point, not stats-tube's figures)."""
        return [b"<yaml>" if ln.startswith(b"---") else
                b"OK" if ln.startswith(b"OK ") else ln
                for ln in buf.split(b"\r\n") if ln]

    ref = [heads(x) for x in res[2]]
    for name, got in (("twheeld", res[0]), ("twheeld -b", res[1])):
        for i, (a, b) in enumerate(zip([heads(x) for x in got], ref)):
            if a != b:
                fail("%s, pipelined behind a waiting reserve-with-timeout "
                     "(%s): replies %r, beanstalkd %r" %
                     (name, ("times out", "a job arrives")[i],
                      b" | ".join(a), b" | ".join(b)))


def kick_pipelined():
    """twheeld -b -f 0: one delayed job (3600 s) in tube k, then `kick 1`
    and `peek-ready` (then `stats-tube k`) in one write. beanstalkd:
    KICKED 1, FOUND <the job>. ROUNDS rounds. Measured on the unfixed
    server: KICKED 1 then NOT_FOUND."""
    ROUNDS = 5

    def run(s):
        c = Client(s.port)
        c.cmd(b"use k\r\n")
        bad = []
        for r in range(ROUNDS):
            jid = put(c, b"kick-me-%d" % r, delay=3600)
            c.send(b"kick 1\r\npeek-ready\r\nstats-tube k\r\n")
            k = c.reply()
            p = c.reply()
            st = yaml_map(c.reply())
            want = b"FOUND %d %d\r\nkick-me-%d\r\n" % (jid, len(b"kick-me-0"),
                                                         r)
            if k != b"KICKED 1\r\n" or p != want or \
                    st["current-jobs-ready"] != "1":
                bad.append((k, p, st["current-jobs-ready"]))
            c.cmd(b"delete %d\r\n" % jid)
        c.close()
        return bad

    res = side_by_side(run, "twheeld -b -f 0", "beanstalkd")
    if res[1]:
        fail("beanstalkd: %r (the case is wrong)" % res[1][:2])
    if res[0]:
        fail("twheeld -b: in %d of %d rounds a command pipelined behind "
             "`kick 1` of a delayed job ran before the kick: "
             "(kick, peek-ready, current-jobs-ready) = %r" %
             (len(res[0]), ROUNDS, res[0][0]))


def half_close():
    """A client sends `put` (ready and delayed jobs) and at once
    shutdown(SHUT_WR), then reads until EOF. beanstalkd answers INSERTED
    before it closes. twheeld in memory, with -b and with -b -f 0 must
    answer it too, ROUNDS times each; and a job stored (seen by peek from
    another connection) whose INSERTED never came is counted."""
    ROUNDS = 10
    names = ["twheeld", "twheeld -b", "twheeld -b -f 0", "beanstalkd"]

    def run(s):
        miss, stored_miss = 0, 0
        peek = Client(s.port)
        for r in range(ROUNDS):
            for delay in (0, 30):
                x = socket.create_connection(("127.0.0.1", s.port),
                                             timeout=5)
                x.sendall(put_cmd(b"half-%d" % r, delay=delay))
                x.shutdown(socket.SHUT_WR)
                buf = b""
                try:
                    while True:
                        dd = x.recv(4096)
                        if not dd:
                            break
                        buf += dd
                except (socket.timeout, ConnectionResetError):
                    pass
                x.close()
                if not buf.startswith(b"INSERTED "):
                    miss += 1
                    # Was it stored nevertheless? (the id is the next one
                    # after the highest seen: peek-ready/peek-delayed)
                    time.sleep(0.1)
                    pr = peek.cmd(b"peek-delayed\r\n" if delay else
                                  b"peek-ready\r\n")
                    if pr.startswith(b"FOUND"):
                        stored_miss += 1
                else:
                    jid = int(buf.split()[1])
                    peek.cmd(b"delete %d\r\n" % jid)
                # Whatever is left, deleted for the next round.
                for cmd in (b"peek-ready\r\n", b"peek-delayed\r\n"):
                    pr = peek.cmd(cmd)
                    if pr.startswith(b"FOUND"):
                        peek.cmd(b"delete %s\r\n" % pr.split()[1])
        peek.close()
        return miss, stored_miss

    res = side_by_side(run, *names)
    for name, (miss, stored) in zip(names, res):
        print("%s: %d of %d puts followed by shutdown(SHUT_WR) got no "
              "INSERTED (%d of them stored)" % (name, miss, 2 * ROUNDS,
                                                stored))
    if res[3][0]:
        fail("beanstalkd does not answer either: the case is wrong")
    for name, (miss, stored) in zip(names[:3], res[:3]):
        if miss:
            fail("%s: %d of %d puts followed by shutdown(SHUT_WR) got no "
                 "INSERTED (beanstalkd answers all), %d of those jobs "
                 "stored" % (name, miss, 2 * ROUNDS, stored))


def delayed_count():
    """twheeld -b (the default -f 50, and -f 0): CONNS connections put
    jobs delayed 1 to 3 s as fast as they can for LOAD s, the server is
    killed with -9 and started again at once, so that many jobs fall due
    while it restarts and just after. No one reserves or deletes them, so
    from the restart on, stats' current-jobs-delayed + current-jobs-ready
    is the number of jobs the server has: at least the acknowledged puts,
    at most those plus the puts whose INSERTED never came (one a
    connection); it must be so in the first `stats` and in one after a
    `stats-job` of every acknowledged job, and each of those must answer
    (delayed or ready), never NOT_FOUND. ROUNDS rounds each.
    The review reported current-jobs-delayed 1 to 49 below the acknowledged
    delayed jobs after a kill -9; with delays of 100 s and more (none due
    around the restart) it is not reproduced here (pipelined puts, -f 0,
    50, 200, --redis: counted exactly); with jobs due around the restart,
    measured on the unfixed server: the sum 427-1,270 below the
    acknowledged jobs, and 15-27 acknowledged jobs (due 0.12-0.18 s after
    the kill, just after the restart) answered NOT_FOUND by stats-job."""
    CONNS = 8
    ROUNDS = 2
    LOAD = 1.0
    for fl in ("50", "0"):
        for rnd in range(ROUNDS):
            d = tempdir()
            try:
                s = start_twheeld("-b", d, "-f", fl)
                stop = threading.Event()
                acked, waiting = [], [0] * CONNS

                def prod(k):
                    try:
                        cc = Client(s.port)
                        n = 0
                        while not stop.is_set():
                            n += 1
                            cc.send(put_cmd(b"%d-%d" % (k, n),
                                            delay=1 + (n + k) % 3))
                            waiting[k] = 1
                            r = cc.line()
                            acked.append(int(r.split()[1]))
                            waiting[k] = 0
                    except (OSError, EOFError, IndexError, ValueError):
                        pass
                ts = [threading.Thread(target=prod, args=(k,), daemon=True)
                      for k in range(CONNS)]
                for t in ts:
                    t.start()
                time.sleep(LOAD)
                s.kill9()
                stop.set()
                for t in ts:
                    t.join(5)
                s = start_twheeld("-b", d, "-f", fl)
                c = Client(s.port, timeout=60)
                st = yaml_map(c.cmd(b"stats\r\n"))
                first = (int(st["current-jobs-delayed"]) +
                         int(st["current-jobs-ready"]))
                c.send(b"".join(b"stats-job %d\r\n" % jid for jid in acked))
                nf = []
                for jid in acked:
                    r = c.reply()
                    if r == b"NOT_FOUND\r\n":
                        nf.append(jid)
                st = yaml_map(c.cmd(b"stats\r\n"))
                later = (int(st["current-jobs-delayed"]) +
                         int(st["current-jobs-ready"]))
                c.close()
                s.kill9()
            finally:
                shutil.rmtree(d, ignore_errors=True)
            unanswered = [sum(waiting)]
            lo, hi = len(acked), len(acked) + unanswered[0]
            print("-f %s round %d: %d acknowledged jobs (%d unanswered); "
                  "after kill -9 and restart delayed + ready %d, then %d; "
                  "%d stats-job NOT_FOUND" % (fl, rnd, lo, unanswered[0],
                                              first, later, len(nf)),
                  flush=True)
            for what, got in (("at once", first),
                              ("after a stats-job of each", later)):
                if not lo <= got <= hi:
                    fail("-f %s round %d: current-jobs-delayed + "
                         "current-jobs-ready %d after kill -9 and restart "
                         "(%s), want %d..%d (%d below the acknowledged "
                         "jobs)" % (fl, rnd, got, what, lo, hi, lo - got))
            if nf:
                fail("-f %s round %d: stats-job answered NOT_FOUND for %d "
                     "acknowledged jobs after kill -9 and restart (first "
                     "%r)" % (fl, rnd, len(nf), nf[:3]))


# ---- finding 6 ----

def kick_due_order():
    """In memory (no -b): delayed jobs put with delays 500, 400, ..., 100 s
    (so by id the last is due first); `kick 2` must kick the two due first,
    as beanstalkd does: peek-ready, reserve order and stats-job states
    compared with a real beanstalkd. Also -b (which kicks by due time
    from the store)."""
    def run(s):
        c = Client(s.port)
        ids = [put(c, b"due-%d" % delay, delay=delay)
               for delay in (500, 400, 300, 200, 100)]
        out = [c.cmd(b"kick 2\r\n")]
        for jid in ids:
            out.append((jid - ids[0],
                        yaml_map(c.cmd(b"stats-job %d\r\n" % jid))["state"]))
        r = c.cmd(b"peek-ready\r\n")
        out.append(r.replace(b"%d" % int(r.split()[1]), b"<id>")
                   if r.startswith(b"FOUND") else r)
        c.close()
        return out

    res = side_by_side(run, "twheeld", "twheeld -b", "beanstalkd")
    for name, got in (("twheeld", res[0]), ("twheeld -b", res[1])):
        if got != res[2]:
            fail("%s: kick 2 of delayed jobs (delays 500..100 s by id): "
                 "%r, beanstalkd %r" % (name, got, res[2]))


def time_left():
    """Right after `put` with delay 10, `release` with delay 10, `pause-tube
    t 10` and a `reserve` with ttr 10, stats-job's time-left and
    stats-tube's pause-time-left must read what beanstalkd's do (it
    truncates: 9). ROUNDS rounds, twheeld in memory and -b, beanstalkd at
    once. Measured on the unfixed server: 10 where beanstalkd says 9."""
    ROUNDS = 3

    def run(s):
        c = Client(s.port)
        out = []
        for r in range(ROUNDS):
            c.cmd(b"use tl%d\r\n" % r)
            jid = put(c, b"d", delay=10)
            out.append(("put delay 10",
                        yaml_map(c.cmd(b"stats-job %d\r\n" % jid))
                        ["time-left"]))
            c.cmd(b"delete %d\r\n" % jid)
            c.cmd(b"watch tl%d\r\n" % r)
            jid = put(c, b"r", pri=0, ttr=10)
            rr = c.cmd(b"reserve-job %d\r\n" % jid)
            out.append(("reserve ttr 10",
                        yaml_map(c.cmd(b"stats-job %d\r\n" % jid))
                        ["time-left"] if rr.startswith(b"RESERVED")
                        else rr))
            c.cmd(b"release %d 0 10\r\n" % jid)
            out.append(("release delay 10",
                        yaml_map(c.cmd(b"stats-job %d\r\n" % jid))
                        ["time-left"]))
            c.cmd(b"delete %d\r\n" % jid)
            c.cmd(b"pause-tube tl%d 10\r\n" % r)
            out.append(("pause-tube 10",
                        yaml_map(c.cmd(b"stats-tube tl%d\r\n" % r))
                        ["pause-time-left"]))
        c.close()
        return out

    res = side_by_side(run, "twheeld", "twheeld -b", "beanstalkd")
    print("beanstalkd: %r" % res[2])
    for name, got in (("twheeld", res[0]), ("twheeld -b", res[1])):
        diff = [(a[0], a[1], b[1]) for a, b in zip(got, res[2]) if a != b]
        if diff:
            fail("%s: %d of %d time-left readings differ from beanstalkd "
                 "(what, twheeld, beanstalkd): %r" %
                 (name, len(diff), len(got), sorted(set(diff))))


def crlf_id():
    """A put whose body does not end in CRLF (EXPECTED_CRLF), then a good
    put: the ids must be beanstalkd's (it uses up an id on the refused
    put: 1, then 3). Memory and -b."""
    data = (put_cmd(b"first") + b"put 0 0 1 3\r\nab\r\n\r\n" +
            put_cmd(b"second") + b"put 0 0 1 2\r\nabcd\r\n" +
            put_cmd(b"third"))

    def run(s):
        return raw_exchange(s.port, data, quiet=0.5)

    res = side_by_side(run, "twheeld", "twheeld -b", "beanstalkd")
    for name, got in (("twheeld", res[0]), ("twheeld -b", res[1])):
        if got != res[2]:
            fail("%s: ids around puts refused with EXPECTED_CRLF: [%s], "
                 "beanstalkd [%s]" % (name, summary(got), summary(res[2])))


def never_early():
    """-b and -b -f 0: ROUNDS puts with delay 1 s, each on a warm
    connection with the client's clock read just before it is sent. The
    due time the store holds (`twheel journal jobs --json`, --twheel
    PATH; skipped without it) must be no sooner than that reading + 1 s,
    and the job must not be reserved sooner either (lower bounds only:
    load makes them later, never earlier). With due times rounded down
    to the millisecond most puts were due before their delay had passed
    (seen: 4 of 5 and 3 of 5 jobs)."""
    ROUNDS = 5
    cli = arg("--twheel")
    if not cli:
        print("skipped: no --twheel")
        raise SystemExit(77)

    def run(s):
        c = Client(s.port)
        c.cmd(b"list-tubes\r\n")
        sent = {}
        for r in range(ROUNDS):
            t0 = time.time()
            sent[put(c, b"e%d" % r, delay=1)] = t0
        jobs = json.loads(subprocess.run(
            [cli, "journal", "jobs", "--json", s.dir], check=True,
            capture_output=True, text=True).stdout)["jobs"]
        bad = [(j["id"], round(sent[j["id"]] * 1e3 + 1000 - j["due_ms"], 3))
               for j in jobs if j["due_ms"] < sent[j["id"]] * 1e3 + 1000]
        if len(jobs) != ROUNDS:
            fail("%d jobs in the store, want %d" % (len(jobs), ROUNDS))
        for _ in range(ROUNDS):
            got = c.cmd(b"reserve\r\n")
            now = time.time()
            jid = int(got.split()[1])
            if now < sent[jid] + 1.0:
                bad.append((jid, "reserved %.3f ms early" %
                            ((sent[jid] + 1.0 - now) * 1e3)))
            c.cmd(b"delete %d\r\n" % jid)
        c.close()
        return bad

    res = side_by_side(run, "twheeld -b", "twheeld -b -f 0")
    for name, bad in (("twheeld -b", res[0]), ("twheeld -b -f 0", res[1])):
        print("%s: %d of %d jobs early (id, ms): %r" %
              (name, len(bad), ROUNDS, bad))
        if bad:
            fail("%s: %d of %d delayed jobs due or reserved before their "
                 "1 s delay had passed since the put was sent (id, ms "
                 "early): %r" % (name, len(bad), ROUNDS, bad))


CASES = {f.__name__: f for f in (
    pipelined_delayed, delete_at_due, long_lines, reserve_order,
    kick_pipelined, half_close, delayed_count, kick_due_order, time_left,
    crlf_id, never_early)}


def main():
    case = None
    for i, a in enumerate(sys.argv):
        if a == "--case":
            case = sys.argv[i + 1]
    todo = [CASES[case]] if case else list(CASES.values())
    t0 = time.monotonic()
    for fn in todo:
        print("== %s" % fn.__name__, flush=True)
        fn()
    print("%.1f s" % (time.monotonic() - t0))
    if FAILS:
        print("%d failures" % len(FAILS))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
