"""deploy/prometheus/alerts.yml: valid for Prometheus (`promtool check rules`) and firing when
it should, with the labels and texts it should (`promtool test rules` on alerts.test.yml:
synthetic series for a scrape that fails, a camera reconnecting in a loop beside one that
streams, a tenth of the frames dropped, a worker down, a webhook losing deliveries, the MQTT
broker away, an event loop waking late). A running Prometheus evaluates the same rules against
a live vdet in test_deploy_prometheus.py."""

from __future__ import annotations

import subprocess

from support.tools import REPO, require_tool

RULES = REPO / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_tool("promtool", provided_by="Debian package prometheus")
    return subprocess.run(
        [exe, *args], cwd=RULES, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_alert_rules_are_valid() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_the_alerts_fire_when_they_should_and_say_what_they_should() -> None:
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_prometheus_config_loads_the_rules() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "alerts.yml" in result.stdout and "SUCCESS: 9 rules found" in result.stdout
