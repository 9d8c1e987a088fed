"""docs/exporter: the alert rules pass promtool, the dashboard's queries name metrics the
exporter serves, and docs/exporter.md documents every metric in one line."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from exportkit import Exporter, need_tools
from gpuslate.exporter.collector import COUNTER, METRICS

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXPORTER_DOCS = DOCS / "exporter"
NAME = re.compile(r"\bgpuslate_[a-z0-9_]+")


def exposed_names() -> set[str]:
    """Every series name the exporter serves (counters with their _total)."""
    return {f"{n}_total" if spec.type == COUNTER else n for n, spec in METRICS.items()}


def dashboard_queries() -> list[str]:
    doc = json.loads((EXPORTER_DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    need_tools("promtool")
    r = subprocess.run(["promtool", "check", "rules", "alerts.yml"], cwd=EXPORTER_DOCS, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS: 6 rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["promtool", "test", "rules", "alerts.test.yml"], cwd=EXPORTER_DOCS, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_alert_rules_name_only_metrics_the_exporter_serves():
    text = (EXPORTER_DOCS / "alerts.yml").read_text()
    exprs = re.findall(r"^\s*expr: (.+)$", text, re.M)
    assert len(exprs) == 6
    for e in exprs:
        names = set(NAME.findall(e))
        assert names and names <= exposed_names(), e


def test_every_dashboard_query_names_metrics_the_exporter_serves():
    queries = dashboard_queries()
    assert len(queries) >= 15
    for q in queries:
        names = set(NAME.findall(q))
        assert names, f"a query without a gpuslate metric: {q}"
        assert names <= exposed_names(), f"{q}: {sorted(names - exposed_names())} are not served"


def test_a_live_scrape_serves_exactly_the_documented_families(sim_host, exporter):
    e: Exporter = exporter()
    _, _, text = e.get()
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert families == exposed_names()  # the text format names counters with their _total


def test_docs_describe_every_metric_in_one_line():
    text = (DOCS / "exporter.md").read_text()
    for name in exposed_names():
        lines = [ln for ln in text.splitlines() if ln.startswith(f"| `{name}")]
        assert len(lines) == 1, f"docs/exporter.md: no single table row for {name}"


def test_the_systemd_unit_runs_the_exporter_on_loopback():
    unit = (EXPORTER_DOCS / "gpuslate-exporter.service").read_text()
    (start,) = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    assert start.split()[1:] == ["exporter", "--listen", "127.0.0.1:9847"]
    assert re.search(r"^KillSignal=SIGTERM$", unit, re.M) and "[Install]" in unit
