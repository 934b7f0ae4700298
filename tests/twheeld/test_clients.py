#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Real beanstalkd clients nobody here wrote, against twheeld and against a
real beanstalkd: the Debian package ruby-beaneater and the npm packages
jackd and fivebeans (scripts/twheeld-clients.sh installs them into
build/npm-clients, or TBD_NPM_DIR; fivebeans pipelines the commands it is
given before their replies come). Each runs one scripted session (tests/twheeld/clients/) of
put with delay, reserve with TTR, touch, release, bury, kick, tubes and
stats against both servers at once; the transcripts must be identical.
A client that is not installed is skipped (exit 77 if none ran).
Usage: test_clients.py --twheeld PATH"""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from bstk import (SKIP, check, have_beanstalkd, start_beanstalkd,
                  start_twheeld)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def clients():
    out = []
    npm = os.environ.get("TBD_NPM_DIR",
                         os.path.join(ROOT, "build", "npm-clients"))
    jackd = os.path.join(npm, "node_modules", "jackd")
    if shutil.which("node") and os.path.isdir(jackd):
        out.append(("jackd (npm)", lambda port: [
            "node", os.path.join(HERE, "clients", "session.js"), str(port),
            jackd]))
    else:
        print("skipped: jackd (run scripts/twheeld-clients.sh)")
    fivebeans = os.path.join(npm, "node_modules", "fivebeans")
    if shutil.which("node") and os.path.isdir(fivebeans):
        # --no-deprecation: its `new Buffer()` warning names the process.
        out.append(("fivebeans (npm)", lambda port: [
            "node", "--no-deprecation",
            os.path.join(HERE, "clients", "session_fivebeans.js"), str(port),
            fivebeans]))
    else:
        print("skipped: fivebeans (run scripts/twheeld-clients.sh)")
    if shutil.which("ruby") and subprocess.run(
            ["ruby", "-e", "require 'beaneater'"],
            stderr=subprocess.DEVNULL).returncode == 0:
        out.append(("beaneater (Debian)", lambda port: [
            "ruby", os.path.join(HERE, "clients", "session.rb"), str(port)]))
    else:
        print("skipped: ruby-beaneater (apt-get install ruby-beaneater)")
    return out


def transcript(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    if not have_beanstalkd():
        print("SKIP: beanstalkd is not installed")
        return SKIP
    todo = clients()
    if not todo:
        return SKIP
    for name, argv in todo:
        servers = [start_twheeld(), start_beanstalkd()]
        try:
            with ThreadPoolExecutor(max_workers=2) as ex:
                fs = [ex.submit(transcript, argv(s.port)) for s in servers]
                (ra, ta), (rb, tb) = [f.result() for f in fs]
        finally:
            for s in servers:
                s.stop()
        check(rb == 0, "%s against beanstalkd failed:\n%s" % (name, tb))
        if ra != 0 or ta != tb:
            print("%s: transcripts differ\n--- twheeld (exit %d)\n%s\n"
                  "--- beanstalkd\n%s" % (name, ra, ta, tb))
            return 1
        print("%s: %d steps, same transcript on both servers"
              % (name, len(ta.splitlines())))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
