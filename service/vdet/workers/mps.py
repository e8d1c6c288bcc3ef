"""NVIDIA MPS for the worker processes that share a GPU: started, reported and stopped here.

Without MPS the kernels of several processes on one GPU are time-sliced; with it they run
side by side through one server (more frames per second and a shorter tail at the same
load: docs/workers.md). vdet
starts a control daemon of its own, with private pipe and log folders, so it neither needs nor
disturbs a system-wide one, and stops it on shutdown. `gpu.mps` chooses:
- off: never;
- auto: when some GPU has more than one worker, nvidia-cuda-mps-control exists and no daemon
  is reachable already (an existing one, e.g. `CUDA_MPS_PIPE_DIRECTORY` set by the operator or
  a device plugin, is used as it is);
- on: as auto, but a daemon that cannot be started is an error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
# Where CUDA looks for the control pipe when CUDA_MPS_PIPE_DIRECTORY is not set.
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")
_TIMEOUT_S = 30.0


@dataclasses.dataclass
class MpsDaemon:
    """An MPS control daemon: `env` is what the workers need to reach it. `owned` is False for
    a daemon that was already running (left alone on stop)."""

    env: dict[str, str]
    owned: bool
    folder: Path | None = None
    active: bool = True

    def stop(self) -> None:
        if not self.owned or not self.active:
            return
        self.active = False
        control = shutil.which(CONTROL_BINARY)
        if control is None:
            return
        env = dict(os.environ, **self.env)
        try:
            subprocess.run(
                [control], input="quit\n", text=True, env=env, timeout=_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("stopping the MPS control daemon failed: %s", exc)
        else:
            log.info("MPS control daemon stopped")
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def running_daemon(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The pipe folder of an MPS daemon that is already reachable, or None."""
    pipe_dir = Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    return pipe_dir if (pipe_dir / "control").exists() else None


def start_mps(mode: str, shared_gpus: tuple[int, ...]) -> MpsDaemon | None:
    """The MPS daemon the workers use (module docstring), or None when they share no GPU or
    `mode` keeps MPS off. RuntimeError when mode is 'on' and none can be had."""
    if mode == "off" or not shared_gpus:
        return None
    existing = running_daemon()
    if existing is not None:
        log.info("MPS: using the daemon already running at %s", existing)
        return MpsDaemon(env={"CUDA_MPS_PIPE_DIRECTORY": str(existing)}, owned=False)
    control = shutil.which(CONTROL_BINARY)
    if control is None:
        if mode == "on":
            raise RuntimeError(f"gpu.mps is 'on' but {CONTROL_BINARY} is not installed")
        log.info("MPS: %s not found; workers sharing a GPU are time-sliced", CONTROL_BINARY)
        return None
    folder = Path(tempfile.mkdtemp(prefix="vdet-mps-"))
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for sub in ("pipe", "log"):
        (folder / sub).mkdir()
    try:
        subprocess.run([control, "-d"], env=dict(os.environ, **env), check=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        if mode == "on":
            raise RuntimeError(f"gpu.mps is 'on' but the MPS daemon did not start: {exc}") from exc
        log.warning("MPS: the control daemon did not start (%s); workers are time-sliced", exc)
        return None
    log.info("MPS: control daemon started for GPU(s) %s (%s)", list(shared_gpus), folder)
    return MpsDaemon(env=env, owned=True, folder=folder)
