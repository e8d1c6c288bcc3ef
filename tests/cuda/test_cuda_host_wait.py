"""`gpu.host_wait`: the scheduling bits it writes, its checks, and a machine without a GPU.

What the flag does to a live CUDA context is tested on the GPU (tests/cuda/test_cuda_launch.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

from vdet.cuda.host_wait import HOST_WAITS, sched_flags, set_host_wait
from vdet.gpu.devices import GpuTuning


@pytest.mark.parametrize(
    ("mode", "bits"), [("auto", 0x0), ("spin", 0x1), ("yield", 0x2), ("block", 0x4)]
)
def test_sched_flags_replace_only_the_scheduling_bits(mode: str, bits: int) -> None:
    # 0x08 (map host) and 0x10 (keep local memory) are other context flags: kept as they are.
    assert sched_flags(0x18 | 0x1, mode) == 0x18 | bits
    assert sched_flags(0x0, mode) == bits


def test_every_mode_is_known_and_the_default_blocks() -> None:
    assert set(HOST_WAITS) == {"block", "spin", "yield", "auto"}
    assert GpuTuning().host_wait == "block"


def test_an_unknown_mode_is_refused_before_cuda_is_touched() -> None:
    with pytest.raises(ValueError, match="one of"):
        set_host_wait(0, "sleepy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="about machines without a GPU")
def test_without_a_gpu_the_pool_logs_and_keeps_cuda_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vdet.gpu.devices import _apply_host_wait

    with caplog.at_level(logging.WARNING, logger="vdet.gpu.devices"):
        _apply_host_wait(0, "block")
    assert "not applied on GPU 0" in caplog.text
