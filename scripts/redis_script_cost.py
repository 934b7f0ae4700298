#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Redis CPU of the backend's scripts, one shard at a time.

Usage: scripts/redis_script_cost.py PORT REDIS_PID BENCH_REDIS [N] [K]

Against a redis-server of this machine on PORT (process REDIS_PID, whose
CPU time is read from /proc): N times (default 5,000), on a fresh shard
{cost:i}, a SCHED of K timers (default 12) due past the claim horizon,
alone; then followed by a CLAIM whose horizon is too short to take them
(an idle claim); then by a CLAIM that takes all K; then the same with a
CLAIM whose per-timer ZADD of the claim is cut out (what a claim without
per-timer writes would save at most). Each case pipelined through
`redis-cli --pipe`, the database flushed after it; prints Redis CPU in
us per iteration and, for the claims, per timer beyond the idle claim.
The script texts come from `BENCH_REDIS scripts`.
"""
import subprocess
import sys
import time


def cpu_us(pid):
    with open("/proc/%d/stat" % pid) as f:
        st = f.read().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) * 1e6 / 100  # utime + stime ticks


def resp(*args):
    a = [str(x).encode() for x in args]
    return b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x)
                                           for x in a)


def cli(port, *args, data=None):
    return subprocess.run(["redis-cli", "-p", str(port)] + list(args),
                          input=data, check=True,
                          capture_output=True).stdout.decode().strip()


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    port, pid, bench = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 5000
    k = int(sys.argv[5]) if len(sys.argv) > 5 else 12
    out = subprocess.run([bench, "scripts"], check=True,
                         capture_output=True).stdout.split(b"\0")
    text = {out[i].decode(): out[i + 1].decode()
            for i in range(0, len(out) - 1, 2)}
    zadd = "redis.call('ZADD',D,unpack(za))\n"
    if text["CLAIM"].count(zadd) != 1:
        sys.exit("CLAIM's ZADD of the claims not found")
    sha = {name: cli(port, "script", "load", body) for name, body in
           (("SCHED", text["SCHED"]), ("CLAIM", text["CLAIM"]),
            ("CLAIM-", text["CLAIM"].replace(zadd, "")))}
    now = int(time.time() * 1000)
    due = now + 100000
    cases = (("schedule", None, 0), ("idle claim", "CLAIM", now + 2000),
             ("claim", "CLAIM", now + 200000),
             ("claim, no ZADD", "CLAIM-", now + 200000))
    base = {}
    for name, script, until in cases:
        parts = []
        for i in range(n):
            keys = ["{cost:%d}:%s" % (i, c) for c in "dpsvqx"]
            items = []
            for j in range(k):
                items += ["k%d-%d" % (i, j), due,
                          "%d,1,payload-32-bytes-.............." % due]
            parts.append(resp("EVALSHA", sha["SCHED"], 6, *keys, now,
                              now + 2000, 30000, *items))
            if script:
                parts.append(resp("EVALSHA", sha[script], 6, *keys, now,
                                  until, 30000, 1000, 0))
        data = b"".join(parts)
        c0 = cpu_us(pid)
        cli(port, "--pipe", data=data)
        us = (cpu_us(pid) - c0) / n
        cli(port, "flushall")
        base[name] = us
        extra = ""
        if script and until > now + 2000:
            extra = "  (%.2f us a timer beyond the idle claim)" % (
                (us - base["idle claim"]) / k)
        print("%-16s %7.1f us Redis CPU per iteration%s" % (name, us, extra))


if __name__ == "__main__":
    main()
