#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld under hostile clients: 10,000 idle connections (fewer if the fd
limit cannot be raised), a client that never reads its replies (memory
stays bounded, others are served, and once it reads it gets every reply),
endless lines, bodies cut off by a hang-up. The server stays up.
Usage: test_limits.py --twheeld PATH"""
import resource
import select
import socket
import sys
import time

from bstk import Client, check, start_twheeld, yaml_map


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(want, hard) if hard != resource.RLIM_INFINITY else want
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def idle_connections(s, limit):
    n = min(10000, limit - 100)  # each process has its own limit
    base = s.rss_kb()
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(("127.0.0.1", s.port)))
    c = Client(s.port)
    # All accepted: the server counts them (it may still be accepting).
    end = time.time() + 30
    while True:
        m = yaml_map(c.cmd(b"stats\r\n"))
        if int(m["current-connections"]) == n + 1 or time.time() > end:
            break
        time.sleep(0.05)
    check(int(m["current-connections"]) == n + 1,
          "connections counted: %s of %d" % (m["current-connections"], n + 1))
    # Each still answers, the busy one too.
    check(c.cmd(b"put 0 0 10 2\r\nhi\r\n").startswith(b"INSERTED"), "put")
    for k in range(0, n, 97):
        socks[k].sendall(b"list-tube-used\r\n")
    for k in range(0, n, 97):
        check(socks[k].recv(100) == b"USING default\r\n", "idle conn %d" % k)
    per = (s.rss_kb() - base) * 1024 / n
    print("idle: %d connections, %.0f bytes of RSS each" % (n, per))
    check(per < 4096, "an idle connection costs %.0f bytes" % per)
    for k in socks:
        k.close()
    c.close()


def never_reads(s, want=20000, size=4096):
    c = Client(s.port)
    body = b"x" * size
    r = c.cmd(b"put 0 0 10 %d\r\n%s\r\n" % (len(body), body))
    jid = int(r.split()[1])
    cmd = b"peek %d\r\n" % jid
    one = b"FOUND %d %d\r\n%s\r\n" % (jid, size, body)
    hog = socket.create_connection(("127.0.0.1", s.port))
    hog.setblocking(False)
    base = s.rss_kb()
    data = cmd * want
    sent = 0
    stalled_since = None
    # Send without reading until all is sent or the server has stopped
    # taking bytes for a second.
    while sent < len(data):
        try:
            sent += hog.send(data[sent:])
            stalled_since = None
        except BlockingIOError:
            if stalled_since is None:
                stalled_since = time.time()
            elif time.time() - stalled_since > 1.0:
                break
            time.sleep(0.01)
    time.sleep(0.5)
    grew = s.rss_kb() - base
    print("never-reads: %d of %d commands sent, %d MB of replies unread, "
          "server grew %d KiB" % (sent // len(cmd), want,
                                  want * len(one) >> 20, grew))
    check(grew < 16384, "memory bounded: grew %d KiB" % grew)
    # Others are served meanwhile.
    t0 = time.time()
    check(c.cmd(b"stats-job %d\r\n" % jid).startswith(b"OK "), "others")
    check(time.time() - t0 < 2.0, "others served promptly")
    # Now read (and send the rest): every reply comes, in order.
    total = want * len(one)
    got = 0
    big = one * (1 + (1 << 20) // len(one) + 2)
    while got < total:
        wl = [hog] if sent < len(data) else []
        rl, wl, _ = select.select([hog], wl, [], 10)
        check(rl or wl, "replies stopped at %d of %d bytes" % (got, total))
        if wl:
            sent += hog.send(data[sent:])
        if rl:
            d = hog.recv(1 << 20)
            check(d, "connection closed")
            o = got % len(one)
            check(d == big[o:o + len(d)], "reply bytes at %d" % got)
            got += len(d)
    check(got == total, "exactly the replies: %d of %d bytes" % (got, total))
    print("never-reads: all %d replies came once it read" % want)
    hog.close()
    c.close()


def junk(s):
    c = Client(s.port)
    # A line of a million bytes: dropped, then one BAD_FORMAT once it
    # ends (as beanstalkd: a reply at the end of the line, so that a
    # pipelining client pairs the next reply with the next command).
    c.send(b"y" * 1000000)
    c.send(b"\r\nlist-tube-used\r\n")
    check(c.reply() == b"BAD_FORMAT\r\n", "endless line")
    check(c.reply() == b"USING default\r\n", "next line after junk")
    # A body cut off by a hang-up; a body of binary bytes.
    d = Client(s.port)
    d.send(b"put 0 0 1 100\r\nonly a part")
    d.close()
    body = bytes(range(256)) * 4
    r = c.cmd(b"put 0 0 1 %d\r\n%s\r\n" % (len(body), body))
    jid = int(r.split()[1])
    check(c.cmd(b"peek %d\r\n" % jid) ==
          b"FOUND %d %d\r\n%s\r\n" % (jid, len(body), body), "binary body")
    # Too big: the body is dropped, the connection goes on.
    big = b"z" * 70000
    check(c.cmd(b"put 0 0 1 %d\r\n%s\r\n" % (len(big), big)) ==
          b"JOB_TOO_BIG\r\n", "too big")
    check(c.cmd(b"list-tube-used\r\n") == b"USING default\r\n", "after big")
    c.close()
    print("junk: ok")


def main():
    limit = raise_fd_limit(25000)
    s = start_twheeld()
    try:
        idle_connections(s, limit)
        never_reads(s)
        junk(s)
        c = Client(s.port)
        check(c.cmd(b"list-tube-used\r\n") == b"USING default\r\n", "alive")
        c.close()
    finally:
        rc = s.stop()
    check(rc == 0, "exit code %s" % rc)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
