# SPDX-License-Identifier: MIT
"""Helpers of twheeld's tests: start twheeld and beanstalkd on loopback
ports, talk the protocol, compare replies."""
import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77  # ctest SKIP_RETURN_CODE


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, timeout=20.0):
    """Until a connection to @port succeeds (the server is up)."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("server did not listen on %d" % port)


_servers = []
_redis = []


@atexit.register
def _stop_all():
    """No server outlives its test, whatever way the test ends."""
    for s in _servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    for p in _redis:
        if p.poll() is None:
            p.kill()
            p.wait()


class Server:
    """A twheeld or beanstalkd process on a free loopback port."""

    def __init__(self, argv, name):
        self.port = free_port()
        self.name = name
        self.argv = argv + ["-l", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE
                                     if os.environ.get("TBD_QUIET") else None)
        _servers.append(self)
        wait_port(self.port, self.proc)

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def twheeld_path():
    for i, a in enumerate(sys.argv):
        if a == "--twheeld":
            return sys.argv[i + 1]
    return os.environ.get("TWHEELD", "twheeld")


def sanitized():
    """Whether the twheeld under test is built with AddressSanitizer or
    ThreadSanitizer, whose shadow memory and quarantine make resident
    memory say nothing of the server's own."""
    path = shutil.which(twheeld_path()) or twheeld_path()
    with open(path, "rb") as f:
        image = f.read()
    return b"__asan_init" in image or b"__tsan_init" in image


def start_twheeld(*extra):
    """A twheeld with @extra arguments; the directory of a -b is made
    first (twheeld, as beanstalkd, refuses one that does not exist)."""
    for i, a in enumerate(extra[:-1]):
        if a == "-b":
            os.makedirs(extra[i + 1], exist_ok=True)
    return Server([twheeld_path()] + list(extra), "twheeld")


def have_beanstalkd():
    return shutil.which("beanstalkd") is not None


def start_beanstalkd(*extra):
    return Server(["beanstalkd"] + list(extra), "beanstalkd")


class Client:
    """A blocking protocol client that reads exactly one reply."""

    def __init__(self, port, timeout=10.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.s.close()

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        i = self.buf.index(b"\r\n")
        ln, self.buf = self.buf[:i], self.buf[i + 2:]
        return ln

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def reply(self):
        """One whole reply: the line, plus its body for RESERVED/FOUND/OK."""
        ln = self.line()
        w = ln.split(b" ")
        if w[0] in (b"RESERVED", b"FOUND") and len(w) == 3:
            body = self.exact(int(w[2]) + 2)
            return ln + b"\r\n" + body
        if w[0] == b"OK" and len(w) == 2:
            body = self.exact(int(w[1]) + 2)
            return ln + b"\r\n" + body
        return ln + b"\r\n"

    def cmd(self, data):
        self.send(data)
        return self.reply()

    def closed(self, timeout=5.0):
        """True once the server closed the connection (EOF)."""
        self.s.settimeout(timeout)
        try:
            while True:
                d = self.s.recv(65536)
                if not d:
                    return True
                self.buf += d
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True


def yaml_map(reply):
    """The key: value pairs of an OK reply's YAML."""
    body = reply.split(b"\r\n", 1)[1]
    out = {}
    for ln in body.decode().splitlines():
        m = re.match(r"^([a-z-]+): (.*)$", ln)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def start_redis(d):
    """A redis-server on a free loopback port that persists nothing (its
    files in @d); killed at exit whatever way the test ends. Returns the
    process and its port."""
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind",
                          "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", d], stdout=subprocess.DEVNULL)
    _redis.append(p)
    wait_port(port, p)
    return p, port


def with_redis(namespace, fn):
    """Runs fn(server) with a redis-server of its own, where server(node)
    starts a twheeld --node node on @namespace there; prints "ok" and
    returns 0 when @fn returns, SKIP without redis-server. Everything
    started is stopped."""
    if not shutil.which("redis-server"):
        print("SKIP: redis-server missing")
        return SKIP
    d = tempdir()
    redis, port = start_redis(d)
    url = "redis://127.0.0.1:%d" % port

    def server(node):
        return start_twheeld("--redis", url, "--namespace", namespace,
                             "--node", str(node))
    try:
        fn(server)
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(d, ignore_errors=True)
    print("ok")
    return 0


def put_job(c, body, pri=10, delay=0, ttr=60):
    """put through Client @c; the new job's id."""
    r = c.cmd(b"put %d %d %d %d\r\n%s\r\n" % (pri, delay, ttr, len(body),
                                                body))
    check(r.startswith(b"INSERTED "), "put: %r" % r)
    return int(r.split()[1])


def tempdir():
    return tempfile.mkdtemp(prefix="twheeld-test-")


def check(cond, msg):
    if not cond:
        print("FAIL:", msg, flush=True)
        sys.exit(1)
