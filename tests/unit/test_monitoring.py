"""The dashboard and alerting rules a team imports (infra/grafana, infra/prometheus): the
rules pass ``promtool check rules`` and their unit tests ``promtool test rules``; the dashboard
is Grafana JSON whose every panel queries a metric the bridge exports, and it charts every
figure the rules alert on. Without promtool the promtool tests are skipped with the reason,
except in CI (``CI=true``), where ``.ci/run`` installs Debian's ``prometheus``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bridge.telemetry import names

INFRA = Path(__file__).resolve().parents[2] / "infra"
RULES = INFRA / "prometheus" / "fencebridge-alerts.yml"
RULE_TESTS = INFRA / "prometheus" / "fencebridge-alerts.test.yml"
DASHBOARD = INFRA / "grafana" / "fencebridge.json"
#: the exporter's names (docs/telemetry.md): dots to underscores, counters _total, s _seconds
METRIC = re.compile(r"fencebridge_[a-z_]+")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "no promtool on PATH (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}: the alerting rules must be checked in CI")
        pytest.skip(f"{reason}; the alerting rules are not checked")
    return found


def exported() -> set[str]:
    """Every metric name (and histogram series) the bridge exports, as Prometheus sees it."""
    found: set[str] = set()
    for value in vars(names).values():
        if isinstance(value, str) and value.startswith("fencebridge.") and " " not in value:
            base = value.replace(".", "_")
            found |= {base, f"{base}_total", f"{base}_seconds", f"{base}_seconds_bucket"}
            found |= {f"{base}_seconds_count", f"{base}_seconds_sum"}
    return found


def test_the_rules_pass_promtool_check() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_unit_tested_firing() -> None:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in cases
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert {r["alert"] for r in rules} == fired


def test_rules_and_dashboard_query_only_exported_metrics() -> None:
    text = RULES.read_text() + DASHBOARD.read_text()
    unknown = sorted(set(METRIC.findall(text)) - exported())
    assert unknown == []


def test_the_dashboard_charts_every_alerted_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    charted = {
        m
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for m in METRIC.findall(target["expr"])
    }
    alerted = set(METRIC.findall(RULES.read_text()))
    assert alerted <= charted
    titles = [p["title"] for p in dashboard["panels"]]
    assert titles[:4] == [
        "Claimed but stalled",
        "Oldest unknown",
        "Quarantine rate",
        "Takeover rate",
    ]
    assert {"Throughput", "Lag", "Lost broker leases"} <= set(titles)
    assert all(p["fieldConfig"]["defaults"]["unit"] for p in dashboard["panels"])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
