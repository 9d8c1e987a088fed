"""``gpuslate exporter``: serve Prometheus metrics of who holds the GPUs until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ...exporter import DEFAULT_LISTEN, SCHEMA
from ...extras import Extra, require
from ..exits import ExitStatus, exit_epilog
from .common import add_common, describe, note, positive_duration


def build(p: argparse.ArgumentParser) -> None:
    """Its options (the parser is made from its row of the command table, with its summary)."""
    describe(
        p, examples=[("metrics on 127.0.0.1:9847 for a Prometheus on this host", "gpuslate exporter"),
                     ("for a Prometheus elsewhere (the metrics name processes, users and jobs)",
                      "gpuslate exporter --listen 0.0.0.0:9847 --allow-remote")],
        description="Serve /metrics (Prometheus text format or OpenMetrics) and /healthz. Every scrape takes one "
        "fresh reading of the GPUs and their holders, as 'status' does, grouped by gpuslate's job rule, with "
        "leaked and orphaned memory per GPU, managed units, and clear runs and signals from the audit log. "
        "Runs until SIGTERM or Ctrl-C. With --json, one gpuslate.exporter.v1 line with the bound address is "
        "printed once listening. See docs/exporter.md.",
        epilog=exit_epilog({0: "stopped by SIGTERM or Ctrl-C",
                            2: "bad input (a non-loopback --listen without --allow-remote, an address in use, "
                               "prometheus_client not installed): nothing was started",
                            5: "the state folder (audit log, units) is unsafe"}))
    add_common(p)
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR:PORT",
                   help=f"address and port to serve on (default {DEFAULT_LISTEN}; [::1]:PORT for IPv6; "
                        "port 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen address (the metrics name processes, users and jobs)")
    p.add_argument("--scrape-timeout", type=positive_duration, default=5.0, metavar="DURATION",
                   help="longest a scrape waits for its reading; then it answers with an error counted "
                        "(default 5s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    require("exporter", Extra.EXPORTER)  # a missing extra: one clear line, not an ImportError
    # imported here, not at the top: only once the extra is known to be there
    from ...api import Host  # lazy: startup
    from ...exporter.collector import registry_for  # lazy: startup
    from ...exporter.server import MetricsServer, format_address, parse_listen  # lazy: startup

    address = parse_listen(args.listen, allow_remote=args.allow_remote)  # bad input: before anything opens
    with Host.open(getattr(args, "sim", None)) as host:  # one context for the exporter's life
        backend = host.backend  # opened first: no driver is exit 3 before anything listens
        server = MetricsServer(registry_for(host, timeout=args.scrape_timeout), address)
        try:
            # SIGTERM and SIGINT are taken by sigwait below: blocked before the server's threads
            # start, they inherit the mask, and the signal waits for this thread (no handler runs
            # inside a scrape); the process exits right after, so the mask is never restored
            stop_signals = {signal.SIGTERM, signal.SIGINT}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
            server.start()
            _announce(args, format_address(server.address), server.address, backend.name)
            signal.sigwait(stop_signals)
        finally:
            server.close()
    return ExitStatus.OK  # stopped by SIGTERM or Ctrl-C, as an exporter ends


def _announce(args: argparse.Namespace, bound: str, address: tuple[str, int], backend: str) -> None:
    """With --json, the one gpuslate.exporter.v1 line (docs/exporter.md); else a line on stderr."""
    if not args.json:
        note(f"serving http://{bound}/metrics ({backend}); SIGTERM or Ctrl-C stops")
        return
    doc = {"schema": SCHEMA, "listen": bound, "address": address[0], "port": address[1],
           "metrics_url": f"http://{bound}/metrics", "backend": backend, "pid": os.getpid()}
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
