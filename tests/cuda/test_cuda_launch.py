"""On the GPU: how a frame's graph is launched and how host threads wait for the GPU.

`graph_launcher` must launch a torch graph through `cuGraphLaunch` on the runner's stream and
compute exactly what `replay()` computes; `set_host_wait` must change the live primary context
that PyTorch already uses, and work must still complete under every mode.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from vdet.cuda.host_wait import host_wait_of, set_host_wait
from vdet.gpu.graphs import graph_launcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def restore_host_wait() -> Iterator[None]:
    torch.cuda.init()
    before = host_wait_of(0)
    yield
    set_host_wait(0, before)


@pytest.mark.usefixtures("restore_host_wait")
@pytest.mark.parametrize("mode", ["block", "spin", "yield", "auto"])
def test_host_wait_changes_the_live_context_and_work_still_completes(mode: str) -> None:
    x = torch.randn(1024, 1024, device="cuda")  # the primary context is active from here
    set_host_wait(0, mode)
    assert host_wait_of(0) == mode
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = x @ x
    done = torch.cuda.Event()
    done.record(stream)
    done.synchronize()
    torch.testing.assert_close(y, x @ x)


def test_graph_launcher_runs_the_graph_on_the_stream_like_replay() -> None:
    stream = torch.cuda.Stream()
    source = torch.randn(4096, device="cuda")
    target = torch.zeros_like(source)
    with torch.cuda.stream(stream):
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            target.copy_(source * 2 + 1)
    launch = graph_launcher(graph, stream)
    assert launch.__name__ == "launch"  # cuGraphLaunch, not the replay() fallback
    for value in (1.0, -3.5, 7.25):
        source.fill_(value)
        stream.wait_stream(torch.cuda.current_stream())
        launch()
        stream.synchronize()
        assert torch.all(target == value * 2 + 1)
