"""docker-compose.yml: validated by the real `docker-compose config`, and what it must contain.

No Docker engine is needed: `config` parses, validates against the Compose schema, resolves
anchors and interpolation, and prints the effective file, which the tests then inspect.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.tools import REPO, docker_compose, require_tool

from vdet.config.settings import load_settings

COMPOSE_FILE = REPO / "docker-compose.yml"
CAMERA_URL = "rtsp://camera:8554/demo"


def compose(*args: str) -> subprocess.CompletedProcess[str]:
    return docker_compose(COMPOSE_FILE, *args)


@pytest.fixture(scope="module")
def effective() -> dict[str, Any]:
    """The effective configuration, as `docker-compose config` prints it."""
    result = compose("config")
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_compose_file_is_valid_for_both_profiles() -> None:
    for profile in ("gpu", "cpu"):
        result = compose("--profile", profile, "config", "--quiet")
        assert result.returncode == 0, f"--profile {profile}: {result.stderr}"
        assert "WARNING" not in result.stderr, result.stderr


def test_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    # The check above means something only if `config` does fail on a schema error.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  vdet:\n    image: vdet\n    deploy: {resources: 3}\n")
    exe = require_tool("docker-compose", provided_by="Debian package docker-compose")
    result = subprocess.run(
        [exe, "-f", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0


def test_services_and_profiles(effective: dict[str, Any]) -> None:
    services = effective["services"]
    assert set(services) == {"vdet", "vdet-cpu", "camera", "prometheus", "grafana"}
    assert services["vdet"]["profiles"] == ["gpu"]
    assert services["vdet-cpu"]["profiles"] == ["cpu"]
    for always in ("camera", "prometheus", "grafana"):
        assert "profiles" not in services[always]


def test_gpu_service_reserves_an_nvidia_gpu_and_caches_engines(effective: dict[str, Any]) -> None:
    vdet = effective["services"]["vdet"]
    assert vdet["build"]["dockerfile"] == "deploy/Dockerfile.gpu"
    devices = vdet["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu", "compute", "utility", "video"]}
    ]
    assert "engines:/var/lib/vdet/engines:rw" in vdet["volumes"]
    assert "engines" in effective["volumes"]


def test_cpu_service_needs_no_gpu_and_answers_to_the_same_name(effective: dict[str, Any]) -> None:
    cpu = effective["services"]["vdet-cpu"]
    assert cpu["build"]["dockerfile"] == "deploy/Dockerfile.cpu"
    assert "deploy" not in cpu
    assert "vdet" in cpu["networks"]["default"]["aliases"]


@pytest.mark.parametrize("service", ["vdet", "vdet-cpu"])
def test_vdet_reads_its_config_from_the_mounted_file(
    effective: dict[str, Any], service: str
) -> None:
    spec = effective["services"][service]
    assert spec["environment"]["VDET_CONFIG"] == "/etc/vdet/vdet.yaml"
    assert f"{REPO}/deploy/vdet.yaml:/etc/vdet/vdet.yaml:ro" in spec["volumes"]
    assert {"published": 8000, "target": 8000} in spec["ports"]


@pytest.mark.parametrize("service", ["vdet", "vdet-cpu"])
def test_the_streams_file_lives_on_the_state_volume(
    effective: dict[str, Any], service: str
) -> None:
    """What the API changes must outlive the container: deploy/vdet.yaml's `streams_file` is
    on the named volume both variants mount (the images make that folder the vdet user's)."""
    settings = load_settings(REPO / "deploy" / "vdet.yaml")
    assert settings.streams_file is not None
    assert settings.streams_file.parent == Path("/var/lib/vdet/state")
    assert "state:/var/lib/vdet/state:rw" in effective["services"][service]["volumes"]
    assert "state" in effective["volumes"]


def test_every_bind_mounted_file_exists(effective: dict[str, Any]) -> None:
    for name, spec in effective["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name}: {source} does not exist"


def test_deployed_vdet_config_is_valid_and_watches_the_demo_camera(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("VDET_"):
            monkeypatch.delenv(name)
    settings = load_settings(REPO / "deploy" / "vdet.yaml")
    assert settings.host == "0.0.0.0"
    assert settings.port == 8000
    assert [(s.id, s.url) for s in settings.sources] == [("demo", CAMERA_URL)]


def test_camera_loops_the_bundled_clip_on_the_path_vdet_reads(effective: dict[str, Any]) -> None:
    camera = effective["services"]["camera"]
    assert camera["image"].startswith("bluenviron/mediamtx:") and "ffmpeg" in camera["image"]
    assert f"{REPO}/service/vdet/assets/sample.mp4:/media/sample.mp4:ro" in camera["volumes"]
    mediamtx = yaml.safe_load((REPO / "deploy" / "camera" / "mediamtx.yml").read_text())
    command = mediamtx["paths"]["demo"]["runOnInit"]
    assert "-stream_loop -1" in command and "-i /media/sample.mp4" in command
    assert mediamtx["paths"]["demo"]["runOnInitRestart"] is True
    assert CAMERA_URL.rsplit("/", 1)[1] in mediamtx["paths"]


def test_prometheus_and_grafana_get_their_provisioning(effective: dict[str, Any]) -> None:
    services = effective["services"]
    prometheus_volumes = services["prometheus"]["volumes"]
    assert f"{REPO}/deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in (
        prometheus_volumes
    )
    # Beside it, where its rule_files entry (a path relative to the config) finds it.
    assert f"{REPO}/deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in (
        prometheus_volumes
    )
    grafana = services["grafana"]
    assert f"{REPO}/deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert f"{REPO}/deploy/grafana/dashboards:/etc/grafana/dashboards:ro" in grafana["volumes"]
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/vdet.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
    datasource = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_host_ports_are_variables_and_the_camera_is_not_published() -> None:
    """A host with 8000, 9090 or 3000 taken picks others; the camera's RTSP port only with the
    override file that asks for it."""
    env = {"VDET_HOST_PORT": "18000", "PROMETHEUS_HOST_PORT": "19090", "GRAFANA_HOST_PORT": "13000"}
    result = subprocess.run(
        [
            require_tool("docker-compose", provided_by="Debian package docker-compose"),
            "--project-directory",
            str(REPO),
            "-f",
            str(COMPOSE_FILE),
            "config",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))},
            **env,
        },
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    published = {
        name: [p["published"] for p in spec.get("ports", [])] for name, spec in services.items()
    }
    assert published == {
        "vdet": [18000],
        "vdet-cpu": [18000],
        "prometheus": [19090],
        "grafana": [13000],
        "camera": [],
    }
    with_camera = compose("-f", str(REPO / "deploy/compose.camera-port.yml"), "config")
    assert with_camera.returncode == 0, with_camera.stderr
    camera = yaml.safe_load(with_camera.stdout)["services"]["camera"]
    assert [p["published"] for p in camera["ports"]] == [8554]
