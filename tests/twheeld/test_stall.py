#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld -b -f 0 (the reply after fdatasync) while the store's fdatasync
stalls: tests/twheeld/stall_sync.c, preloaded, holds every fdatasync and
fsync while a file of the test exists. Cases (--case NAME, default all):

readers: a put's fdatasync is held for up to STALL s; meanwhile commands
  that write nothing (use, stats, reserve-with-timeout 0, list-tubes on a
  new connection) are answered within READ_BOUND s, and no put is
  acknowledged (INSERTED) until the sync is let go; then every put is.
disconnect: clients that put and close (or half-close) while the sync is
  held: the server stays up, and their jobs, written, are there after a
  restart.
lone: the same with one connection, whose sync the event loop's own
  thread makes: a connection made meanwhile is served.
segment: puts held at a segment change (8 MiB segments), whose fsync
  of the old segment the store makes under its lock: use and stats are
  answered meanwhile, and every INSERTED job is there, body and all,
  after a kill -9 and a restart.

Usage: test_stall.py --twheeld PATH --stall-lib PATH [--case NAME]"""
import os
import select
import shutil
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bstk  # noqa: E402
from bstk import check  # noqa: E402

STALL = 8.0  # the longest a sync is held (s); released earlier when done
READ_BOUND = 2.0  # generous: a loaded 2-core machine, ASan


def arg(name):
    for i, a in enumerate(sys.argv):
        if a == name:
            return sys.argv[i + 1]
    return None


class Stall:
    """The stall file of the preloaded injector, in directory @d."""

    def __init__(self, d):
        self.path = os.path.join(d, "stall")

    def hold(self):
        """Holds the syncs from now, for STALL s at most (a server that
        does not answer meanwhile fails the test, after it)."""
        open(self.path, "w").close()
        self.timer = threading.Timer(STALL, self.let_go)
        self.timer.daemon = True
        self.timer.start()

    def let_go(self):
        if os.path.exists(self.path):
            os.unlink(self.path)

    def wait_held(self, timeout=10.0):
        """Until a sync is held (the injector's marker is there)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(self.path + ".on"):
                return
            time.sleep(0.005)
        check(False, "no fdatasync was held within %.0f s" % timeout)


def start(d, stall_lib, stall):
    """twheeld -b D/j -f 0 with the injector preloaded."""
    os.environ["TBD_STALL"] = stall.path
    pre = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = stall_lib + (":" + pre if pre else "")
    # An ASan build wants its runtime first in the list: it is (linked),
    # the injector only adds two symbols.
    os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                                  ":verify_asan_link_order=0").lstrip(":")
    try:
        return bstk.start_twheeld("-b", os.path.join(d, "j"), "-f", "0")
    finally:
        if pre is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = pre


OPEN = []  # the clients of the server under test, closed before it stops


def client(port, timeout=30):
    c = bstk.Client(port, timeout=timeout)
    OPEN.append(c)
    return c


def stop(srv):
    """Stops @srv after closing its clients (a connection still open at
    exit is reported as a leak under ASan); its exit code."""
    while OPEN:
        OPEN.pop().close()
    return srv.stop()


def quiet(c, secs):
    """True when nothing arrives on Client @c within @secs."""
    if c.buf:
        return False
    r, _, _ = select.select([c.s], [], [], secs)
    return not r


def timed(c, data):
    """The reply to @data on @c and how long it took (s)."""
    t0 = time.monotonic()
    r = c.cmd(data)
    return r, time.monotonic() - t0


def case_readers(d, lib):
    st = Stall(d)
    srv = start(d, lib, st)
    try:
        writers = [client(srv.port) for _ in range(4)]
        rd = [client(srv.port) for _ in range(3)]
        bstk.put_job(writers[0], b"warm")  # the store is open and synced
        rd[2].cmd(b"watch other\r\n")
        st.hold()
        t_hold = time.monotonic()
        writers[0].send(b"put 1 0 60 1\r\na\r\n")
        st.wait_held()
        for w in writers[1:]:
            w.send(b"put 1 0 60 1\r\nb\r\n")
        for cmd, c in ((b"use t1\r\n", rd[0]), (b"stats\r\n", rd[1]),
                       (b"reserve-with-timeout 0\r\n", rd[2])):
            r, took = timed(c, cmd)
            check(took < READ_BOUND,
                  "%r took %.2f s while the sync was held" % (cmd, took))
            check(not r.startswith(b"INTERNAL"), "%r: %r" % (cmd, r))
        late = client(srv.port)
        r, took = timed(late, b"list-tubes\r\n")
        check(took < READ_BOUND and r.startswith(b"OK "),
              "a new connection's list-tubes: %r in %.2f s" % (r, took))
        # Not acknowledged before it is durable: nothing for the writers
        # while the sync is held (checked for a while).
        check(time.monotonic() - t_hold < STALL - 1, "the checks took long")
        for w in writers:
            check(quiet(w, 0.2), "a put was acknowledged while its "
                  "fdatasync was held: %r" % w.buf)
        st.let_go()
        for w in writers:
            r = w.reply()
            check(r.startswith(b"INSERTED "), "after the sync: %r" % r)
        # And the loop is back to its usual way: a put, a read.
        bstk.put_job(writers[1], b"after")
        check(rd[0].cmd(b"use t2\r\n") == b"USING t2\r\n", "use after")
    finally:
        st.let_go()
        check(stop(srv) == 0, "twheeld exited with %s" % srv.proc.returncode)


def hold_a_put(srv, st, body):
    """A new client of @srv whose put of @body waits in a held sync."""
    c = client(srv.port)
    bstk.put_job(c, b"warm")  # the store is open and synced
    st.hold()
    c.send(b"put 1 0 60 %d\r\n%s\r\n" % (len(body), body))
    st.wait_held()
    return c


def case_lone(d, lib):
    st = Stall(d)
    srv = start(d, lib, st)
    try:
        # The only connection: its sync runs on the loop's thread.
        c = hold_a_put(srv, st, b"a")
        late = client(srv.port)
        r, took = timed(late, b"stats\r\n")
        check(took < READ_BOUND and r.startswith(b"OK "),
              "a new connection's stats: %r in %.2f s" % (r[:20], took))
        late.send(b"put 1 0 60 1\r\nb\r\n")
        check(quiet(c, 0.2) and quiet(late, 0.2),
              "acknowledged while its fdatasync was held")
        st.let_go()
        check(c.reply().startswith(b"INSERTED "), "the held put")
        check(late.reply().startswith(b"INSERTED "), "the put behind it")
    finally:
        st.let_go()
        check(stop(srv) == 0, "twheeld exited with %s" % srv.proc.returncode)


def jobs_ready(c):
    return int(bstk.yaml_map(c.cmd(b"stats\r\n"))["current-jobs-ready"])


def case_disconnect(d, lib):
    st = Stall(d)
    srv = start(d, lib, st)
    try:
        c = hold_a_put(srv, st, b"x")
        # One closes at once after its put; one sends 20 puts and shuts
        # its sending side; one resets its connection.
        a = socket.create_connection(("127.0.0.1", srv.port))
        a.sendall(b"put 1 0 60 1\r\na\r\n")
        a.close()
        b = socket.create_connection(("127.0.0.1", srv.port))
        b.sendall(b"put 1 0 60 1\r\nb\r\n" * 20)
        b.shutdown(socket.SHUT_WR)
        r = socket.create_connection(("127.0.0.1", srv.port))
        r.sendall(b"put 1 0 60 1\r\nr\r\n")
        r.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                     b"\x01\x00\x00\x00\x00\x00\x00\x00")
        r.close()
        other = client(srv.port)
        # The three puts and the twenty are read (in memory) meanwhile.
        end = time.monotonic() + READ_BOUND * 5
        while jobs_ready(other) < 24 and time.monotonic() < end:
            time.sleep(0.05)
        st.let_go()
        check(c.reply().startswith(b"INSERTED "), "the held put")
        b.close()
        n = jobs_ready(other)
        check(n == 24, "jobs ready after the sync: %d, not 24" % n)
        # The clients that left are gone from the server too (c, other
        # stay).
        end, conns = time.monotonic() + READ_BOUND * 5, -1
        while time.monotonic() < end and conns != 2:
            conns = int(bstk.yaml_map(other.cmd(b"stats\r\n"))
                        ["current-connections"])
            time.sleep(0.05)
        check(conns == 2, "connections after the clients left: %d" % conns)
    finally:
        st.let_go()
        check(stop(srv) == 0, "twheeld exited with %s" % srv.proc.returncode)
    srv = start(d, lib, st)
    try:
        n = jobs_ready(client(srv.port))
        check(n == 24, "jobs after a restart: %d, not 24" % n)
    finally:
        stop(srv)


def case_segment(d, lib):
    st = Stall(d)
    srv = start(d, lib, st)
    body = 60000
    # 8 MiB segments: ~138 of these fill one short of the change; the
    # writes held next cross it, so that a held sync is the old
    # segment's, which the store makes under its lock.
    fill, more = 8 * 1024 * 1024 // (body + 100) - 1, 5
    ids = {}
    try:
        c = client(srv.port, 60)
        other = client(srv.port, 60)
        for k in range(fill):
            b = b"%05d" % k * (body // 5)
            ids[bstk.put_job(c, b)] = b
        st.hold()
        for k in range(fill, fill + more):
            b = b"%05d" % k * (body // 5)
            c.send(b"put 1 0 60 %d\r\n%s\r\n" % (len(b), b))
        st.wait_held()
        time.sleep(0.5)  # all read meanwhile (no reply may come)
        for cmd in (b"use s\r\n", b"stats\r\n"):
            r, took = timed(other, cmd)
            check(took < READ_BOUND, "%r took %.2f s while the sync (at a "
                  "segment change) was held" % (cmd, took))
        check(quiet(c, 0), "acknowledged while held: %r" % c.buf[:40])
        st.let_go()
        for k in range(fill, fill + more):
            r = c.reply()
            check(r.startswith(b"INSERTED "), "put: %r" % r)
            ids[int(r.split()[1])] = b"%05d" % k * (body // 5)
        segs = [f for f in os.listdir(os.path.join(d, "j"))
                if f.endswith(".twj")]
        check(len(segs) >= 2, "one segment only: %r" % segs)
    finally:
        st.let_go()
        srv.kill9()
        while OPEN:
            OPEN.pop().close()
    srv = start(d, lib, st)
    try:
        c = client(srv.port)
        for i, b in ids.items():
            r = c.cmd(b"peek %d\r\n" % i)
            check(r == b"FOUND %d %d\r\n%s\r\n" % (i, len(b), b),
                  "job %d after kill -9: %r" % (i, r[:60]))
    finally:
        stop(srv)


CASES = {"readers": case_readers, "lone": case_lone,
         "disconnect": case_disconnect,
         "segment": case_segment}


def main():
    lib = arg("--stall-lib")
    if not lib or not os.path.exists(lib):
        print("SKIP: no --stall-lib")
        return bstk.SKIP
    lib = os.path.abspath(lib)
    only = arg("--case")
    for name, fn in CASES.items():
        if only and name != only:
            continue
        d = bstk.tempdir()
        try:
            fn(d, lib)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        print("ok", name, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
