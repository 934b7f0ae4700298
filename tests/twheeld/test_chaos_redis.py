#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis under load, with kill -9 and SIGSTOP of its servers.
One redis-server (started here on a free loopback port, always stopped)
and two twheeld (--node 1 and --node 2, -V, stderr kept in a temp file
each) on one namespace. A producer a server puts jobs (40% of them delayed
1-3 s; a quarter to tube keep, which no worker watches, so that many
jobs live through every round), three workers a server reserve from
tube work, hold each job up to HOLD s (so that a stopped or killed
server holds reserved jobs) and delete most (some released with a delay
of 0-2 s, some buried; a `kick` now and then). Every reply is recorded:
INSERTED id, RESERVED id, DELETED / NOT_FOUND of a delete; a delete
whose reply never came (connection reset by a kill, or no reply within
CMD_TIMEOUT) is "in doubt", unless its server was killed before it was
sent (then it reached no server).
Meanwhile ROUNDS (4) rounds in a random order, each on a server picked
at random (--seed N replays the plan, not the load's timing): kill -9
and start again (same --node) after 1-3 s; kill -9 and start again after
KILL_LONG s (past its liveness record: the other takes its jobs over,
and the restart waits for that); twice SIGSTOP for 12-15 s (past its
takeover: liveness record 10 s, shard lease 5 s) and SIGCONT.
Then the load stops and the servers settle: SETTLE_MIN s after the last
round at least (a takeover's liveness record and shard lease,
docs/guide/twheeld.md), then a poll every second, `stats-job` (the
lookup of `peek`, with the state) of every id through both servers,
until two polls agree and every job that must exist is found, at most
SETTLE_MAX s after the last round (the guide's
takeover bound is 30 s; a SIGCONT'd server waits up to 30 s for a
takeover before it reads back). Checks:
  - nothing acknowledged lost: every id answered INSERTED whose delete
    was never answered DELETED and was never in doubt is found (any
    state) on one of the servers. The guide allows a job to be delivered
    twice after a takeover (a reserved job of a dead or stopped server),
    never to vanish undeleted: a job is only allowed to be missing if a
    delete of it was sent and its reply lost. Missing jobs are reported
    apart as never delivered and delivered at least once (also a
    failure: the guide has a reserved job of a dead or stopped server
    come back, never vanish);
  - nothing deleted back: no id answered DELETED is found on any server,
    now and after kill -9 and restart of both servers; and no reserve
    sent after a DELETED of that id was received returned it.
Printed: each round, the counts, deliveries of one job more than once
(allowed after a takeover, counted only), the takeovers and fencing
the servers logged. On failure: the history of each offending job, its
record in Redis, the lines of the servers' logs that name it, and the
logs' tails (the logs are kept; TBD_KEEP=1 keeps them on success too).
Timing for a loaded 2-core machine: commands wait CMD_TIMEOUT (45 s)
for a reply, since a SIGCONT'd server may wait 30 s for a takeover
before it answers; starts wait 45 s for the port. 82-88 s measured on
a 2-core machine, also with two busy loops beside it.
Skipped (77) without redis-server.
Usage: test_chaos_redis.py --twheeld BINARY [--seed N]"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bstk  # noqa: E402
from bstk import Client  # noqa: E402

NAMESPACE = "chaos"
ROUNDS = 4
WARMUP = 5.0            # load before the first round
GAP = (5.0, 8.0)        # load between rounds
KILL_SHORT = (1.0, 3.0)  # down time of a kill -9 round: restart, no takeover
KILL_LONG = 12.0        # past the 10 s liveness record: taken over
STOP = (12.0, 15.0)     # SIGSTOP: past the takeover (10 s + 5 s lease)
TAIL = 3.0              # load after the last round
SETTLE_MIN = 16.0       # liveness record 10 s + shard lease 5 s + 1
SETTLE_MAX = 60.0       # the guide's takeover bound (30 s) twice
RESTART_MAX = 40.0      # both restarted: until every job is found
CMD_TIMEOUT = 45.0
START_TIMEOUT = 45.0
PUT_PAUSE = 0.04        # per producer: about 20 puts a second
KEEP = 0.25             # puts to tube keep, which no worker watches
WORKERS = 3             # a server
HOLD = 0.2              # a worker holds a job up to HOLD s, then acts
TTR = 10
PEEK_BATCH = 200
# Lines of the servers' -V logs printed at the end: the takeovers and
# fencing that the rounds caused.
SERVER_EVENTS = ("=== test", "is dead", "handed over", "takeover",
                 "no liveness renewal", "ran out", "cannot read")


def now():
    return time.monotonic()


T0 = now()


def say(msg):
    print("[%6.1f] %s" % (now() - T0, msg), flush=True)


class Node:
    """twheeld --node N on a fixed loopback port, its stderr appended to
    a log file across restarts."""

    def __init__(self, binary, url, node, d):
        self.node = node
        self.port = bstk.free_port()
        self.log = os.path.join(d, "twheeld-%d.log" % node)
        self.argv = [binary, "--redis", url, "--namespace", NAMESPACE,
                     "--node", str(node), "-V", "-l", "127.0.0.1",
                     "-p", str(self.port)]
        self.proc = None
        self.stopped = False
        self.kills = 0  # kill -9s done: a connection older is dead
        self.start()

    def mark(self, what):
        with open(self.log, "a") as f:
            f.write("=== test [%.1f]: %s\n" % (now() - T0, what))

    def start(self):
        self.mark("start")
        with open(self.log, "a") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=f)
        bstk._servers.append(self)  # killed at exit, whatever happens
        bstk.wait_port(self.port, self.proc, timeout=START_TIMEOUT)

    def kill9(self):
        self.mark("kill -9")
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1
        self.stopped = False

    def sigstop(self):
        self.mark("SIGSTOP")
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self):
        self.mark("SIGCONT")
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False


class Job:
    __slots__ = ("id", "put_srv", "put_t", "delay", "tube", "reserves",
                 "acks", "doubt", "notfound", "other", "moved")

    def __init__(self, jid):
        self.id = jid
        self.put_srv = None
        self.put_t = None
        self.delay = None
        self.tube = None
        self.moved = 0       # released or buried by a worker
        self.reserves = []   # (server, sent, got)
        self.acks = []       # DELETED: (server, got)
        self.doubt = []      # delete sent, no reply: (server, sent)
        self.notfound = []   # delete answered NOT_FOUND: (server, got)
        self.other = []      # (server, command, reply, t)

    def history(self):
        out = ["job %d: put via node %s at %s (tube %s, delay %s)" % (
            self.id, self.put_srv, fmt_t(self.put_t), self.tube,
            self.delay)]
        for s, sent, got in self.reserves:
            out.append("  reserved via node %d (sent %s, got %s)" %
                       (s, fmt_t(sent), fmt_t(got)))
        for s, t in self.acks:
            out.append("  DELETED via node %d at %s" % (s, fmt_t(t)))
        for s, t in self.notfound:
            out.append("  delete NOT_FOUND via node %d at %s" % (s, fmt_t(t)))
        for s, t in self.doubt:
            out.append("  delete in doubt via node %d (sent %s)" %
                       (s, fmt_t(t)))
        for s, c, r, t in self.other:
            out.append("  node %d: %s -> %r at %s" % (s, c, r, fmt_t(t)))
        return "\n".join(out)


def fmt_t(t):
    return "-" if t is None else "%.2f" % (t - T0)


class Book:
    """Every acknowledgement, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.jobs = {}
        self.put_doubt = 0
        self.put_other = []
        self.reserved_after_delete = []
        self.counts = {"put": 0, "reserve": 0, "delete": 0,
                       "delete NOT_FOUND": 0, "doubt": 0,
                       "delete unsent": 0, "release": 0,
                       "bury": 0, "kicked": 0}

    def job(self, jid):
        j = self.jobs.get(jid)
        if j is None:
            j = self.jobs[jid] = Job(jid)
        return j


BOOK = Book()
NODES = {}
STOP_LOAD = threading.Event()


def connect(node):
    """A client of @node once it listens (it may be down or stopped)."""
    while not STOP_LOAD.is_set():
        try:
            return Client(node.port, timeout=CMD_TIMEOUT)
        except OSError:
            time.sleep(0.3)
    return None


def producer(node, rng, tag):
    c = None
    seq = 0
    while not STOP_LOAD.is_set():
        if c is None:
            c = connect(node)
            if c is None:
                return
            used = b"default"
        seq += 1
        delay = 0 if rng.random() < 0.6 else rng.randint(1, 3)
        tube = b"keep" if rng.random() < KEEP else b"work"
        body = b"%s-%d" % (tag, seq)
        try:
            if tube != used:
                used = None
                r = c.cmd(b"use %s\r\n" % tube)
                if r != b"USING %s\r\n" % tube:
                    raise EOFError("use: %r" % r)
                used = tube
            r = c.cmd(b"put 10 %d %d %d\r\n%s\r\n" % (delay, TTR, len(body),
                                                     body))
        except (OSError, EOFError):
            with BOOK.lock:
                BOOK.put_doubt += 1
            c.close()
            c = None
            continue
        t = now()
        with BOOK.lock:
            if r.startswith(b"INSERTED "):
                j = BOOK.job(int(r.split()[1]))
                j.put_srv, j.put_t, j.delay = node.node, t, delay
                j.tube = tube.decode()
                BOOK.counts["put"] += 1
            else:
                BOOK.put_other.append((node.node, r, t))
        time.sleep(PUT_PAUSE)
    if c:
        c.close()


def worker(node, rng):
    c = None
    n = 0
    while not STOP_LOAD.is_set():
        n += 1
        pending = None
        try:
            if c is None:
                gen = node.kills
                c = connect(node)
                if c is None:
                    return
                for cmd, want in ((b"use work\r\n", b"USING work\r\n"),
                                  (b"watch work\r\n", b"WATCHING 2\r\n"),
                                  (b"ignore default\r\n",
                                   b"WATCHING 1\r\n")):
                    r = c.cmd(cmd)
                    if r != want:
                        raise EOFError("%r: %r" % (cmd, r))
            if n % 25 == 0:
                r = c.cmd(b"kick 20\r\n")
                if r.startswith(b"KICKED "):
                    with BOOK.lock:
                        BOOK.counts["kicked"] += int(r.split()[1])
                continue
            sent = now()
            r = c.cmd(b"reserve-with-timeout 1\r\n")
            got = now()
            if not r.startswith(b"RESERVED "):
                continue
            jid = int(r.split(b" ")[1])
            with BOOK.lock:
                j = BOOK.job(jid)
                j.reserves.append((node.node, sent, got))
                BOOK.counts["reserve"] += 1
                if any(t < sent for _, t in j.acks):
                    BOOK.reserved_after_delete.append((jid, node.node, sent))
            x = rng.random()
            if x < 0.85:
                cmd, word = b"delete %d\r\n" % jid, "delete"
            elif x < 0.95:
                cmd, word = (b"release %d 10 %d\r\n" %
                             (jid, rng.randint(0, 2)), "release")
            else:
                cmd, word = b"bury %d 10\r\n" % jid, "bury"
            time.sleep(rng.uniform(0, HOLD))  # the work: a job held
            # A connection to a server killed since it was made: the
            # command cannot reach any server (not in doubt).
            pending = (word, jid, now(), gen != node.kills)
            r = c.cmd(cmd)
            got = now()
            pending = None
            with BOOK.lock:
                j = BOOK.job(jid)
                if word == "delete" and r == b"DELETED\r\n":
                    j.acks.append((node.node, got))
                    BOOK.counts["delete"] += 1
                elif word == "delete" and r == b"NOT_FOUND\r\n":
                    j.notfound.append((node.node, got))
                    BOOK.counts["delete NOT_FOUND"] += 1
                elif (word, r) in (("release", b"RELEASED\r\n"),
                                   ("bury", b"BURIED\r\n")):
                    BOOK.counts[word] += 1
                    j.moved += 1
                else:
                    j.other.append((node.node, word, r, got))
        except (OSError, EOFError):
            if pending:
                with BOOK.lock:
                    BOOK.job(pending[1]).moved += 1
            if pending and pending[0] == "delete" and pending[3]:
                with BOOK.lock:
                    BOOK.job(pending[1]).other.append(
                        (node.node, "delete", b"<server killed before>",
                         pending[2]))
                    BOOK.counts["delete unsent"] += 1
            elif pending and pending[0] == "delete":
                with BOOK.lock:
                    BOOK.job(pending[1]).doubt.append((node.node,
                                                       pending[2]))
                    BOOK.counts["doubt"] += 1
            c.close()
            c = None
    if c:
        c.close()


def peek_all(node, ids):
    """{id: state} of the ids of @ids that @node finds (stats-job)."""
    out = {}
    c = Client(node.port, timeout=CMD_TIMEOUT)
    try:
        ids = list(ids)
        for i in range(0, len(ids), PEEK_BATCH):
            part = ids[i:i + PEEK_BATCH]
            c.send(b"".join(b"stats-job %d\r\n" % jid for jid in part))
            for jid in part:
                r = c.reply()
                if r.startswith(b"OK "):
                    out[jid] = bstk.yaml_map(r).get("state", "?")
                elif r != b"NOT_FOUND\r\n":
                    raise RuntimeError("stats-job %d via node %d: %r" %
                                       (jid, node.node, r))
    finally:
        c.close()
    return out


def classify():
    """(must exist, deleted, in doubt) id sets from the book."""
    with BOOK.lock:
        must, deleted, doubt = set(), set(), set()
        for j in BOOK.jobs.values():
            if j.acks:
                deleted.add(j.id)
            elif j.doubt:
                doubt.add(j.id)
            elif j.put_t is not None:
                must.add(j.id)
        return must, deleted, doubt


def survey(nodes, ids):
    """{id: [(node, state)]} of every id of @ids found."""
    where = {}
    for n in nodes:
        for jid, st in peek_all(n, ids).items():
            where.setdefault(jid, []).append((n.node, st))
    return where


def settle(nodes, ids, must, deleted, t_min, t_max, what):
    """Polls until every id of @must is found, nothing of @deleted is,
    and two polls agree (from @t_min on), or until @t_max."""
    last = None
    polls = 0
    seen_deleted = set()
    while True:
        where = survey(nodes, ids)
        polls += 1
        found = set(where)
        seen_deleted |= found & deleted
        good = must <= found and not (found & deleted)
        key = tuple(sorted((k, tuple(v)) for k, v in where.items()))
        t = now()
        if t >= t_min and good and key == last:
            break
        if t >= t_max:
            say("%s: not settled by the bound (%d polls)" % (what, polls))
            break
        last = key
        time.sleep(1.0)
    transient = seen_deleted - (set(where) & deleted)
    say("%s: %d polls, %d ids found" % (what, polls, len(where)))
    if transient:
        say("%s: %d deleted jobs were found during the settling and are "
            "gone now: %s" % (what, len(transient), sorted(transient)[:20]))
    return where


def report(where, must, deleted, what):
    found = set(where)
    missing = sorted(must - found)
    with BOOK.lock:
        never = [j for j in missing if not BOOK.jobs[j].reserves]
        delivered = [j for j in missing if BOOK.jobs[j].reserves]
    back = sorted(found & deleted)
    twice = sorted(j for j, w in where.items() if len(w) > 1)
    say("%s: %d must exist, %d found of them; lost: %d never delivered, "
        "%d delivered (and not deleted); deleted back: %d; on both "
        "servers: %d" % (what, len(must), len(must & found), len(never),
                         len(delivered), len(back), len(twice)))
    fails = []
    if never:
        fails.append("%s: %d acknowledged jobs lost, never delivered: %s" %
                     (what, len(never), never[:20]))
    if delivered:
        fails.append("%s: %d acknowledged jobs lost after a delivery (not "
                     "deleted): %s" % (what, len(delivered), delivered[:20]))
    if back:
        fails.append("%s: %d deleted jobs back: %s" %
                     (what, len(back), [(j, where[j]) for j in back[:20]]))
    return fails, missing[:10] + back[:10]


def rounds_plan(rng):
    kinds = ["kill-short", "kill-long", "stop", "stop"][:ROUNDS]
    rng.shuffle(kinds)
    return [(k, rng.choice((1, 2))) for k in kinds]


def session(binary, url, d, seed):
    rng = random.Random(seed)
    nodes = NODES
    nodes[1] = Node(binary, url, 1, d)
    nodes[2] = Node(binary, url, 2, d)
    threads = []
    for i, n in enumerate(nodes.values()):
        threads.append(threading.Thread(
            target=producer, args=(n, random.Random(seed + 10 + i),
                                   b"p%d" % n.node), daemon=True))
        for k in range(WORKERS):
            threads.append(threading.Thread(
                target=worker, args=(n, random.Random(seed + 20 + 10 * i + k)),
                daemon=True))
    for t in threads:
        t.start()
    say("load started: 1 producer and %d workers a server (%d%% of the "
        "puts to tube keep, which no worker watches)" % (WORKERS,
                                                         KEEP * 100))
    time.sleep(WARMUP)
    t_last = now()
    for i, (kind, which) in enumerate(rounds_plan(rng)):
        n = nodes[which]
        with BOOK.lock:
            before = dict(BOOK.counts)
        if kind.startswith("kill"):
            down = (rng.uniform(*KILL_SHORT) if kind == "kill-short"
                    else KILL_LONG)
            n.kill9()
            say("round %d: kill -9 of node %d, down %.1f s" %
                (i + 1, which, down))
            time.sleep(down)
            t = now()
            n.start()
            say("round %d: node %d started again, listening after %.1f s" %
                (i + 1, which, now() - t))
        else:
            held = rng.uniform(*STOP)
            n.sigstop()
            say("round %d: SIGSTOP of node %d for %.1f s" %
                (i + 1, which, held))
            time.sleep(held)
            n.sigcont()
            say("round %d: SIGCONT of node %d" % (i + 1, which))
        t_last = now()
        time.sleep(rng.uniform(*GAP) if i + 1 < ROUNDS else TAIL)
        with BOOK.lock:
            delta = {k: BOOK.counts[k] - before[k] for k in before}
        say("round %d: during it %s" % (i + 1, ", ".join(
            "%s %d" % kv for kv in delta.items())))
    STOP_LOAD.set()
    for t in threads:
        t.join(CMD_TIMEOUT + 5)
    with BOOK.lock:
        say("load stopped: %s; puts in doubt %d, other put replies %d" % (
            ", ".join("%s %d" % kv for kv in BOOK.counts.items()),
            BOOK.put_doubt, len(BOOK.put_other)))
        if BOOK.put_other:
            say("other put replies: %r" % BOOK.put_other[:10])
        twice = sum(1 for j in BOOK.jobs.values() if len(j.reserves) > 1
                    and not j.moved)
        odd = [j.id for j in BOOK.jobs.values()
               if any(r != b"<server killed before>" for _, _, r, _ in
                      j.other)]
        say("jobs delivered more than once, never released nor buried by "
            "a worker: %d (a takeover may deliver twice; so may a TTR "
            "of %d s that ran out)" % (twice, TTR))
        if odd:
            say("other replies (a bury or release NOT_FOUND after a takeover "
            "is expected) for %d jobs: %s" % (
                len(odd), "; ".join(BOOK.jobs[j].history().replace(
                    "\n", " |") for j in odd[:5])))
    must, deleted, doubt = classify()
    ids = sorted(BOOK.jobs)
    with BOOK.lock:
        kept = sum(1 for j in must if BOOK.jobs[j].tube == "keep")
    say("%d ids seen: %d must exist (%d in tube keep), %d deleted, %d with "
        "a delete in doubt" % (len(ids), len(must), kept, len(deleted),
                               len(doubt)))
    where = settle(list(nodes.values()), ids, must, deleted,
                   t_last + SETTLE_MIN, t_last + SETTLE_MAX, "settled")
    fails, bad = report(where, must, deleted, "now")
    with BOOK.lock:
        rad = list(BOOK.reserved_after_delete)
    if rad:
        fails.append("%d reserves returned a job after its DELETED: %s" %
                     (len(rad), rad[:20]))
        bad += [j for j, _, _ in rad[:10]]
    for n in nodes.values():
        n.kill9()
    say("kill -9 of both servers")
    for n in nodes.values():
        t = now()
        n.start()
        say("node %d started again, listening after %.1f s" %
            (n.node, now() - t))
    t = now()
    where = settle(list(nodes.values()), ids, must, deleted, t,
                   t + RESTART_MAX, "after the restart of both")
    f2, b2 = report(where, must, deleted, "after restart")
    fails += f2
    bad += b2
    return nodes, fails, bad


def redis_cmd(port, *args):
    """One RESP command to redis-server; the reply, roughly parsed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    f = s.makefile("rb")

    def one():
        ln = f.readline()
        if ln[:1] == b"$":
            n = int(ln[1:])
            return None if n < 0 else f.read(n + 2)[:-2]
        if ln[:1] == b"*":
            return [one() for _ in range(int(ln[1:]))]
        return ln.strip()
    try:
        return one()
    finally:
        s.close()


def redis_record(port, jid):
    """Where Redis holds key j<id> of the namespace (docs/guide/redis.md:
    {ns:s}:p values due,attempt,payload; {ns:s}:d its due or -token;
    {ns:s}:q quarantine), over the 64 shards."""
    key = b"j%d" % jid
    out = []
    for sh in range(64):
        tag = b"{%s:%d}" % (NAMESPACE.encode(), sh)
        v = redis_cmd(port, b"HGET", tag + b":p", key)
        if v is not None:
            out.append("shard %d :p %r, :d score %r" % (
                sh, v[:60], redis_cmd(port, b"ZSCORE", tag + b":d", key)))
        q = redis_cmd(port, b"HGET", tag + b":q", key)
        if q is not None:
            out.append("shard %d :q %r" % (sh, q[:60]))
    return out or ["no record"]


def dump(nodes, bad, rport):
    for jid in list(dict.fromkeys(bad))[:20]:
        with BOOK.lock:
            print(BOOK.jobs[jid].history() if jid in BOOK.jobs else
                  "job %d: unknown" % jid)
        try:
            for ln in redis_record(rport, jid):
                print("  redis: %s" % ln)
        except (OSError, ValueError) as e:
            print("  redis: %s" % e)
        for n in nodes.values():
            with open(n.log, errors="replace") as f:
                lines = [ln.rstrip() for ln in f if str(jid) in ln]
            for ln in lines[:20]:
                print("  node %d log: %s" % (n.node, ln))
    for n in nodes.values():
        with open(n.log, errors="replace") as f:
            lines = f.readlines()
        marks = [ln for ln in lines if not ln.startswith("=== test")]
        print("---- node %d log (%s): %d lines; test marks and server lines "
              "(last 150):" % (n.node, n.log, len(lines)))
        shown = [ln for ln in lines if ln.startswith("=== test")] + \
            marks[-150:]
        print("".join(sorted(set(shown), key=lines.index)), end="")


def main():
    if not shutil.which("redis-server"):
        print("SKIP: redis-server missing")
        return bstk.SKIP
    seed = int(time.time()) % 100000
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
    binary = bstk.twheeld_path()
    say("seed %d" % seed)
    socket.setdefaulttimeout(CMD_TIMEOUT)
    d = bstk.tempdir()
    redis, port = bstk.start_redis(d)
    nodes, fails, bad = NODES, [], []
    try:
        _, fails, bad = session(binary, "redis://127.0.0.1:%d" % port,
                                    d, seed)
    except Exception as e:  # a failure of the test itself: logs too
        fails.append("%s: %s" % (type(e).__name__, e))
        import traceback
        traceback.print_exc()
    finally:
        STOP_LOAD.set()
        for n in nodes.values():
            if n.proc.poll() is None:
                if n.stopped:
                    n.sigcont()
        if fails:
            dump(nodes, bad, port)
        for n in nodes.values():
            if n.proc.poll() is None:
                n.proc.terminate()
                try:
                    n.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
                    n.proc.wait()
        redis.kill()
        redis.wait()
    for n in nodes.values():  # what the servers did, from their logs
        with open(n.log, errors="replace") as f:
            for ln in f:
                if any(w in ln for w in SERVER_EVENTS):
                    say("node %d log: %s" % (n.node, ln.rstrip()))
    say("run time %.1f s" % (now() - T0))
    for f in fails:
        print("FAIL:", f, flush=True)
    if fails:
        print("(logs in %s, kept)" % d)
        return 1
    if os.environ.get("TBD_KEEP"):
        print("(logs in %s, kept: TBD_KEEP)" % d)
    else:
        shutil.rmtree(d, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
