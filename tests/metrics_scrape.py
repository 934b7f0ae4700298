#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Scrape examples/metrics_server over loopback HTTP and parse what it
serves with prometheus_client's parsers: the Prometheus text format 0.0.4
and (Accept: application/openmetrics-text) the OpenMetrics 1.0 text, whose
parser is strict (names, histogram rules, the closing # EOF). Checks the
values against what the server did: --timers 10, of which 5 were due at
once and fired, 5 are pending. Exit 77 (skipped) without the parser
(Debian python3-prometheus-client, installed by scripts/deps.sh).
Usage: tests/metrics_scrape.py METRICS_SERVER_BINARY"""
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

try:
    from prometheus_client import parser as prom
    from prometheus_client.openmetrics import parser as om
except ImportError:
    print("prometheus_client missing: skipped")
    sys.exit(77)


def fetch(port, path, accept=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def check(families, openmetrics):
    by = {f.name: f for f in families}
    # Both parsers name a counter's family without _total.
    want = {"twheel_durable_pending": "gauge",
            "twheel_durable_dead": "gauge",
            "twheel_durable_fired": "counter",
            "twheel_durable_lateness_seconds": "histogram"}
    for name, typ in want.items():
        assert name in by, (name, sorted(by))
        assert by[name].type == typ, (name, by[name].type)
    value = {s.name: s.value for f in families for s in f.samples
             if s.name != "twheel_durable_lateness_seconds_bucket"}
    assert value["twheel_durable_pending"] == 5, value
    assert value["twheel_durable_fired_total"] == 5, value
    assert value["twheel_durable_running"] == 0, value
    assert value["twheel_durable_dead"] == 0, value
    assert value["twheel_durable_lateness_seconds_count"] == 5, value
    buckets = [s for s in by["twheel_durable_lateness_seconds"].samples
               if s.name.endswith("_bucket")]
    les = [float(s.labels["le"]) for s in buckets]
    counts = [s.value for s in buckets]
    assert les == sorted(les) and les[-1] == float("inf"), les
    assert counts == sorted(counts) and counts[-1] == 5, counts


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.Popen([binary, "--dir", tmp, "--timers", "10",
                              "--requests", "3"], stdout=subprocess.PIPE,
                             text=True)
        try:
            line = p.stdout.readline()
            assert line.startswith("listening on 127.0.0.1:"), line
            port = int(line.rsplit(":", 1)[1])
            ctype, text = fetch(port, "/metrics")
            assert ctype.startswith("text/plain; version=0.0.4"), ctype
            check(list(prom.text_string_to_metric_families(text)), False)
            ctype, text = fetch(port, "/metrics",
                                "application/openmetrics-text; version=1.0.0")
            assert ctype.startswith("application/openmetrics-text"), ctype
            assert text.endswith("# EOF\n"), text[-20:]
            check(list(om.text_string_to_metric_families(text)), True)
            try:
                fetch(port, "/other")
                raise AssertionError("/other answered")
            except urllib.error.HTTPError as e:
                assert e.code == 404, e.code
            assert p.wait(timeout=20) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    print("metrics scrape: both formats parsed, values as expected")


main()
