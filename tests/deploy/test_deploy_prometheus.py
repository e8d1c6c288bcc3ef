"""The monitoring path for real: `vdet serve` on the deployed config, watching a real RTSP
camera that plays the demo clip, scraped by the real Prometheus server on the deployed scrape
config; Grafana's dashboard queries are then run through Prometheus' HTTP API.

Everything listens on loopback ports picked at random. The only edits to the deployed files
are addresses (camera:8554 and vdet:8000 do not resolve here), vdet's port and Prometheus'
scrape interval (1 s instead of 5 s, to keep the test short).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.procs import Process, http_get, http_json, wait_http_ok
from support.rtsp import RtspServer, free_port, gstreamer_rtsp_problem
from support.tools import REPO, require_tool
from support.truth import SAMPLE
from support.waiting import wait_until

pytestmark = pytest.mark.slow

DASHBOARD = REPO / "deploy/grafana/dashboards/vdet.json"
CHECK_STACK = REPO / "deploy/podman/check_stack.py"
# What Grafana puts in place of the dashboard's variables when "All" streams are selected.
GRAFANA_VARIABLES = {"$source": ".*", "$__rate_interval": "15s"}


@dataclass
class Vdet:
    process: Process
    base_url: str

    def metrics_text(self) -> str:
        status, body = http_get(f"{self.base_url}/metrics")
        assert status == 200
        return body.decode()


@dataclass
class Prometheus:
    process: Process
    base_url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        answer = http_json(url)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result


def _skip_or_fail(problem: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy_monitoring")


@pytest.fixture(scope="module")
def camera(workdir: Path) -> Iterator[RtspServer]:
    """The compose stack's demo camera, played by the tests' GStreamer RTSP server."""
    problem = gstreamer_rtsp_problem()
    if problem is not None:
        _skip_or_fail(problem)
    server = RtspServer(SAMPLE, name="demo", log_dir=workdir).start()
    yield server
    server.terminate()


def _start_vdet(workdir: Path, camera_url: str, name: str = "vdet") -> Vdet:
    """`vdet serve` on deploy/vdet.yaml with only its addresses and paths changed; ready when
    returned."""
    config = yaml.safe_load((REPO / "deploy/vdet.yaml").read_text())
    (demo,) = config["sources"]
    assert (demo["id"], demo["url"]) == ("demo", "rtsp://camera:8554/demo")
    port = free_port()
    config.update(host="127.0.0.1", port=port, streams_file=str(workdir / f"{name}.streams.json"))
    demo["url"] = camera_url
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    process = Process(
        [str(Path(sys.executable).parent / "vdet"), "serve", "--config", str(config_path)],
        workdir / f"{name}.log",
        env=env,
    )
    service = Vdet(process, f"http://127.0.0.1:{port}")
    try:
        wait_http_ok(process, f"{service.base_url}/readyz", timeout=60)
    except BaseException:
        process.stop()
        raise
    return service


@pytest.fixture(scope="module")
def vdet(workdir: Path, camera: RtspServer) -> Iterator[Vdet]:
    service = _start_vdet(workdir, camera.url)
    process = service.process
    try:
        _wait_for(lambda: _processed(service.metrics_text()) > 0, 45, process, "frames processed")
        yield service
    finally:
        process.stop()


@pytest.fixture(scope="module")
def prometheus(workdir: Path, vdet: Vdet) -> Iterator[Prometheus]:
    exe = require_tool("prometheus", provided_by="Debian package prometheus")
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["vdet:8000"]
    job["static_configs"][0]["targets"] = [vdet.base_url.removeprefix("http://")]
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    assert config["rule_files"] == ["alerts.yml"]
    config["rule_files"] = [str(REPO / "deploy/prometheus/alerts.yml")]
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    process = Process(
        [
            exe,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        workdir / "prometheus.log",
    )
    server = Prometheus(process, f"http://127.0.0.1:{port}")
    try:
        wait_http_ok(process, f"{server.base_url}/-/ready", timeout=30)
        yield server
    finally:
        process.stop()


def _processed(metrics_text: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "vdet_frames_processed_total" and sample.labels == {"source": "demo"}:
                return float(sample.value)
    return 0.0


def _wait_for(predicate: Any, timeout: float, process: Process, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if not process.alive():
            break
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}:\n{process.log_tail()}")


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 10
    return queries


def _exported_names(metrics_text: str) -> set[str]:
    """Every series name the exposition can produce, with or without samples yet."""
    names: set[str] = set()
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "info": ["_info"],
    }
    for family in text_string_to_metric_families(metrics_text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, []))
        names.update(sample.name for sample in family.samples)
    return names


def test_prometheus_scrapes_vdet_series(prometheus: Prometheus) -> None:
    def scraped() -> bool:
        processed = prometheus.query('vdet_frames_processed_total{source="demo"} > 0')
        buckets = prometheus.query(
            'vdet_stage_latency_seconds_bucket{source="demo", stage="inference", le="+Inf"} > 0'
        )
        return bool(processed and buckets)

    _wait_for(scraped, 30, prometheus.process, "vdet series in Prometheus")
    (up,) = prometheus.query('up{job="vdet"}')
    assert up["value"][1] == "1"
    e2e = prometheus.query('count(vdet_end_to_end_latency_seconds_bucket{source="demo"})')
    assert int(e2e[0]["value"][1]) >= 16  # one series per latency bucket
    state = prometheus.query('vdet_source_state{source="demo", state="streaming"}')
    assert state[0]["value"][1] == "1"
    backend = prometheus.query("vdet_backend_info")
    assert backend[0]["metric"]["backend"] == "onnxruntime"


def test_every_metric_the_dashboard_queries_is_exported(vdet: Vdet) -> None:
    exported = _exported_names(vdet.metrics_text())
    queried = {name for query in _dashboard_queries() for name in re.findall(r"vdet_\w+", query)}
    assert queried, "the dashboard queries no vdet metric"
    assert queried <= exported, f"not exported by vdet: {sorted(queried - exported)}"


def test_dashboard_queries_run_in_prometheus(prometheus: Prometheus) -> None:
    # Wait for two scrapes inside the rate window so that rate() has something to say.
    _wait_for(
        lambda: prometheus.query('rate(vdet_frames_processed_total{source="demo"}[15s]) > 0'),
        30,
        prometheus.process,
        "a processed-frame rate",
    )
    empty = []
    for query in _dashboard_queries():
        promql = query
        for variable, value in GRAFANA_VARIABLES.items():
            promql = promql.replace(variable, value)
        assert "$" not in promql, f"unknown dashboard variable in {query!r}"
        if promql.startswith("label_values("):
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", promql)
            assert match, promql
            metric, label = match.groups()
            values = http_json(
                f"{prometheus.base_url}/api/v1/label/{label}/values?match[]={metric}"
            )
            assert "demo" in values["data"], values
            continue
        if not prometheus.query(promql):  # also fails on a PromQL syntax error
            empty.append(promql)
    # On the CPU nothing reports GPU memory; a line's counter appears with its first crossing;
    # the webhook and MQTT panels stay empty without `notify` (deploy/vdet.yaml sets none),
    # and the clips counter without `clips.folder`; every other panel has data.
    crossings = (
        "sum by (source, zone, class, direction) "
        '(increase(vdet_line_crossings_total{source=~".*"}[5m]))'
    )
    webhooks = {q for q in empty if "vdet_webhook_" in q or "vdet_mqtt_" in q}
    assert len(webhooks) == 5, empty
    assert "sum by (gpu) (vdet_gpu_memory_used_bytes)" in empty, empty
    clips = "sum by (outcome) (rate(vdet_clips_total[15s]))"
    # One node, no fleet: the fleet's counters have no series (its gauges say 0).
    fleet = {
        "sum by (instance, outcome) (rate(vdet_fleet_results_total[15s]))",
        "sum by (event) (increase(vdet_fleet_lease_events_total[1m]))",
        "histogram_quantile(0.99, sum by (instance, le) "
        "(rate(vdet_fleet_bus_ack_seconds_bucket[15s])))",
    }
    assert set(empty) - webhooks <= {
        "sum by (gpu) (vdet_gpu_memory_used_bytes)",
        crossings,
        clips,
        *fleet,
    }, empty


def _check_stack(
    service: Vdet, prometheus_url: str, timeout: float, *options: str
) -> subprocess.CompletedProcess[str]:
    """deploy/podman/check_stack.py, the Podman stack's check in CI, run against `service`."""
    return subprocess.run(
        [
            sys.executable,
            str(CHECK_STACK),
            f"--vdet={service.base_url}",
            f"--prometheus={prometheus_url}",
            f"--timeout={timeout}",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=False,
    )


def test_prometheus_evaluates_the_alert_rules_and_none_fires_on_a_healthy_stack(
    prometheus: Prometheus,
) -> None:
    def evaluated() -> list[dict[str, Any]]:
        groups = http_json(f"{prometheus.base_url}/api/v1/rules")["data"]["groups"]
        rules: list[dict[str, Any]] = [r for g in groups for r in g["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else []
        )

    rules = wait_until(evaluated, 30, what="the alert rules evaluated")
    assert len(rules) == 9 and all(r["health"] == "ok" for r in rules), rules
    state = {r["name"]: r["state"] for r in rules}
    assert "firing" not in state.values(), state
    # Not even pending: vdet answers and its camera streams.
    assert state["VdetDown"] == state["VdetStreamDown"] == "inactive", state


def test_stack_check_passes_on_this_stack(vdet: Vdet, prometheus: Prometheus) -> None:
    result = _check_stack(vdet, prometheus.base_url, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("check_stack: ok") == 5, result.stdout


def test_stack_check_after_a_restart_finds_the_zone_the_first_check_added(
    workdir: Path, camera: RtspServer, prometheus: Prometheus
) -> None:
    """The restart step of CI's Podman stack, here with two `vdet serve` runs on one streams
    file (as the container's two runs share its volume)."""
    service = _start_vdet(workdir, camera.url, name="vdet-restarted")
    try:
        first = _check_stack(service, prometheus.base_url, 60)
        assert first.returncode == 0, first.stdout + first.stderr
    finally:
        service.process.stop()
    service = _start_vdet(workdir, camera.url, name="vdet-restarted")
    try:
        again = _check_stack(service, prometheus.base_url, 60, "--after-restart")
    finally:
        service.process.stop()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ok   the zone added over the API is back" in again.stdout

    fresh = _start_vdet(workdir, camera.url, name="vdet-fresh")
    try:
        none_kept = _check_stack(fresh, prometheus.base_url, 3, "--after-restart")
    finally:
        fresh.process.stop()
    assert none_kept.returncode == 1
    assert "FAIL the zone added over the API is back: never held" in none_kept.stderr


def test_stack_check_fails_without_detections_from_the_camera(
    workdir: Path, prometheus: Prometheus
) -> None:
    nobody_listens = f"rtsp://127.0.0.1:{free_port()}/demo"
    service = _start_vdet(workdir, nobody_listens, name="vdet-without-camera")
    try:
        result = _check_stack(service, prometheus.base_url, timeout=5)
    finally:
        service.process.stop()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL live detections from demo: never held; last seen: no frame" in result.stderr, (
        result.stderr
    )
