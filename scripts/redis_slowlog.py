#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where Redis's time goes: SLOWLOG entries summed by command and script.

Usage: redis-cli -p PORT --json slowlog get 1000000 |
           scripts/redis_slowlog.py N BENCH_REDIS

Reads the JSON of `SLOWLOG GET` (entries [id, time, usec, argv, ...],
recorded with slowlog-log-slower-than 0, so every command, those that
scripts run included) and prints, per 1,000 timers (N the timers of the
run), the calls and the time in each command; EVALSHA and EVAL are split
by script, named by the SHA-1 of the texts that `BENCH_REDIS scripts`
prints (the backend's scripts and the pollers'). A script's time
includes that of the commands it ran, which appear on their own lines as
well. The times are wall time inside the command: on a loaded machine
they are inflated, so the shares mean more than the sums.
"""
import collections
import hashlib
import json
import subprocess
import sys


def script_names(bench):
    out = subprocess.run([bench, "scripts"], check=True,
                         capture_output=True).stdout.split(b"\0")
    names = {}
    for i in range(0, len(out) - 1, 2):
        names[hashlib.sha1(out[i + 1]).hexdigest()] = out[i].decode()
    return names


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    n = int(sys.argv[1])
    names = script_names(sys.argv[2])
    entries = json.load(sys.stdin)
    calls = collections.Counter()
    usec = collections.Counter()
    for e in entries:
        argv = e[3]
        cmd = str(argv[0]).upper()
        if cmd == "EVALSHA" and len(argv) > 1:
            cmd = "EVALSHA " + names.get(argv[1], argv[1][:8])
        elif cmd == "EVAL" and len(argv) > 1:
            digest = hashlib.sha1(argv[1].encode()).hexdigest()
            cmd = "EVAL " + names.get(digest, digest[:8])
        calls[cmd] += 1
        usec[cmd] += int(e[2])
    for cmd, us in usec.most_common(16):
        print("  %-22s %8.1f calls  %7.2f ms  (%6.1f us a call)" %
              (cmd, calls[cmd] * 1000 / n, us / n, us / calls[cmd]))


if __name__ == "__main__":
    main()
