#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""twheeld --redis with a password, and start-up refusals.
A redis-server of its own (random loopback port, requirepass a random
password) takes a twheeld whose password comes from the environment
(TWHEELD_REDIS_PASSWORD), from a file (--redis-password-file) and from the
URL. Checks: each works (a put is INSERTED and found); the password shows
in no output of the server (stderr at -VVV), no /metrics answer, not in
/proc/PID/cmdline once it runs (the URL's is overwritten) nor in
/proc/PID/environ (the variable is wiped); a wrong password is refused at
start-up (exit 1) with a message that names the address but not the
password. And, as beanstalkd: `-b` of a directory that does not exist is
refused at start-up (exit 1, nothing made). Skipped (77) without
redis-server. About 5 s.
Usage: test_credentials.py --twheeld BINARY"""
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bstk import (Client, check, free_port, tempdir, twheeld_path,  # noqa
                  wait_port, _redis)

FAILS = []


def start_redis(d, password):
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind",
                          "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--requirepass", password, "--dir", d],
                         stdout=subprocess.DEVNULL)
    _redis.append(p)
    wait_port(port, p)
    return p, port


def run(argv, env_pw=None, ok=True):
    """Starts twheeld with @argv (stderr to a file); returns (proc, port,
    metrics port, stderr path)."""
    port, mport = free_port(), free_port()
    err = tempdir() + "/stderr"
    env = dict(os.environ)
    if env_pw is not None:
        env["TWHEELD_REDIS_PASSWORD"] = env_pw
    p = subprocess.Popen([twheeld_path(), "-l", "127.0.0.1", "-p", str(port),
                          "--metrics-port", str(mport), "-VVV"] + argv,
                         env=env, stderr=open(err, "w"))
    if ok:
        wait_port(port, p)
    return p, port, mport, err


def leaks(p, mport, err, pw):
    """Where @pw shows: the process's argv and environment, /metrics,
    stderr (read after the process stopped)."""
    where = []
    with open("/proc/%d/cmdline" % p.pid, "rb") as f:
        if pw.encode() in f.read():
            where.append("cmdline")
    with open("/proc/%d/environ" % p.pid, "rb") as f:
        if pw.encode() in f.read():
            where.append("environ")
    m = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                               timeout=10).read()
    if pw.encode() in m:
        where.append("metrics")
    p.terminate()
    p.wait(timeout=20)
    with open(err, "rb") as f:
        if pw.encode() in f.read():
            where.append("stderr")
    return where


def one_way(name, argv, env_pw, pw):
    p, port, mport, err = run(argv, env_pw)
    c = Client(port)
    r = c.cmd(b"put 0 0 10 5\r\nhello\r\n")
    check(r.startswith(b"INSERTED "), "%s: put: %r" % (name, r))
    jid = int(r.split()[1])
    check(c.cmd(b"peek %d\r\n" % jid).startswith(b"FOUND"), name + ": peek")
    c.cmd(b"delete %d\r\n" % jid)
    c.close()
    where = leaks(p, mport, err, pw)
    if where:
        FAILS.append("%s: the password shows in %s" % (name, where))
    print("%s: works, the password shows nowhere" % name
          if not where else "%s: LEAK %s" % (name, where), flush=True)


def refused(name, argv, env_pw, must_not_show):
    p, _, _, err = run(argv, env_pw, ok=False)
    rc = p.wait(timeout=30)
    text = open(err).read()
    check(rc == 1, "%s: exit %s, want 1: %s" % (name, rc, text))
    for s in must_not_show:
        check(s not in text, "%s: %r in %r" % (name, s, text))
    print("%s: exit 1: %s" % (name, text.strip().splitlines()[-1]),
          flush=True)
    return text


def main():
    d = tempdir()
    missing = d + "/no-such-dir"
    text = refused("-b missing dir", ["-b", missing], None, [])
    check(not os.path.exists(missing), "-b made the directory")
    check("no-such-dir" in text, "the message names the directory")
    if not shutil.which("redis-server"):
        print("SKIP: redis-server missing")
        return 77
    pw = "pw-" + secrets.token_hex(12)
    redis, port = start_redis(d, pw)
    url = "redis://127.0.0.1:%d" % port
    try:
        one_way("environment", ["--redis", url], pw, pw)
        pwf = d + "/pw"
        with open(pwf, "w") as f:
            f.write(pw + "\n")
        os.chmod(pwf, 0o600)
        one_way("file", ["--redis", url, "--redis-password-file", pwf],
                None, pw)
        url_pw = "redis://:%s@127.0.0.1:%d" % (pw, port)
        one_way("URL", ["--redis", url_pw, "--namespace", "u"], None, pw)
        bad = "bad-" + secrets.token_hex(8)
        t = refused("wrong password (environment)", ["--redis", url], bad,
                    [bad])
        check("127.0.0.1:%d" % port in t, "the message names the address")
        refused("wrong password (URL)",
                ["--redis", "redis://:%s@127.0.0.1:%d" % (bad, port)], None,
                [bad])
        refused("missing password file",
                ["--redis", url, "--redis-password-file", d + "/none"],
                None, [])
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(d, ignore_errors=True)
    for f in FAILS:
        print("FAIL:", f)
    if FAILS:
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
