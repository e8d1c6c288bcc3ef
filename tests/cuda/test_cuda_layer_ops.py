"""The layer kernels (vdet.cuda.layer_ops: conv bias + SiLU, same max pool) against NumPy
references, on the GPU (`[cuda]`, marked gpu) and on the CPU emulator (`[emu]`).

Tolerances: the max pool is exact (a max of halves is one of them). bias + SiLU computes in
float32 and rounds once to half, as the reference does; CUDA's expf may differ from the host's
in the last float32 bit, which can move the half result by one unit in the last place (ulp):
allowed on the GPU, never more. Inputs: random tensors with ties, infinities and a NaN, and a
real activation (the demo network's SPPF input and a C2f conv output on a sample frame, GPU
only)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.kernels.harness import Harness

from vdet.cuda.layer_ops import LayerOps


def _ops(harness: Harness) -> LayerOps:
    return LayerOps(harness.ops.backend)


def _put_nhwc(harness: Harness, nchw: np.ndarray) -> Any:
    """`nchw` (N, C, H, W) float16 as the kernels read it: NHWC in memory."""
    if harness.torch is None:
        return nchw.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # never a view of nchw
    torch = harness.torch
    tensor = torch.from_numpy(np.ascontiguousarray(nchw)).to("cuda")
    tensor = tensor.contiguous(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    return tensor


def _empty_nhwc(harness: Harness, shape: tuple[int, int, int, int]) -> Any:
    poison = np.full(shape, np.float16(-7777.0), np.float16)
    return _put_nhwc(harness, poison)


def silu_reference(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    y = x.astype(np.float32) + bias.astype(np.float32).reshape(1, -1, 1, 1)
    with np.errstate(over="ignore", invalid="ignore"):  # -inf: -inf * 0 is NaN, as in torch
        gate = np.float32(1.0) / (np.float32(1.0) + np.exp(-y))
        return (y * gate).astype(np.float16)


def max_pool_reference(x: np.ndarray, kernel: int) -> np.ndarray:
    n, c, h, w = x.shape
    half = kernel // 2
    padded = np.full((n, c, h + 2 * half, w + 2 * half), -np.inf, np.float32)
    padded[:, :, half : half + h, half : half + w] = x.astype(np.float32)
    out = np.full((n, c, h, w), -np.inf, np.float32)
    nan = np.zeros((n, c, h, w), bool)
    for dy in range(kernel):
        for dx in range(kernel):
            window = padded[:, :, dy : dy + h, dx : dx + w]
            nan |= np.isnan(window)
            out = np.maximum(out, np.where(np.isnan(window), -np.inf, window))
    out[nan] = np.nan
    return out.astype(np.float16)


def _ulps(got: np.ndarray, want: np.ndarray) -> int:
    """The largest distance in half-precision units in the last place (NaN == NaN)."""
    both_nan = np.isnan(got) & np.isnan(want)
    a = got.view(np.int16).astype(np.int32)
    b = want.view(np.int16).astype(np.int32)
    # Order halves as integers: negative values count down from zero.
    a = np.where(a < 0, -32768 - a, a)
    b = np.where(b < 0, -32768 - b, b)
    return int(np.abs(a - b)[~both_nan].max(initial=0))


@pytest.mark.parametrize("shape", [(1, 32, 12, 20), (2, 6, 3, 5), (1, 3, 1, 1)])
def test_bias_silu_matches_the_reference(harness: Harness, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 6).astype(np.float16)
    specials = np.array([-np.inf, 60000.0, -20.0, 0.0], np.float16)  # -inf, saturating, ...
    x.flat[: min(4, x.size)] = specials[: min(4, x.size)]
    bias = (rng.standard_normal(shape[1]) * 2).astype(np.float16)
    tensor = _put_nhwc(harness, x)
    _ops(harness).bias_silu_(tensor, harness.put(bias), stream=harness.stream)
    got = harness.get(tensor)
    want = silu_reference(x, bias)
    assert got.shape == want.shape
    assert _ulps(got, want) <= (1 if harness.kind == "cuda" else 0)


@pytest.mark.parametrize("kernel", [1, 3, 5])
@pytest.mark.parametrize("shape", [(1, 16, 12, 20), (2, 5, 2, 3)])
def test_max_pool_matches_the_reference(
    harness: Harness, kernel: int, shape: tuple[int, int, int, int]
) -> None:
    rng = np.random.default_rng(kernel * 100 + shape[1])
    x = rng.integers(-20, 20, size=shape).astype(np.float16)  # ties everywhere
    x.flat[1] = -np.inf
    x.flat[7] = np.inf
    x.flat[-1] = np.nan
    out = _empty_nhwc(harness, shape)
    _ops(harness).max_pool_same(_put_nhwc(harness, x), out, kernel, stream=harness.stream)
    got = harness.get(out)
    want = max_pool_reference(x, kernel)
    np.testing.assert_array_equal(got, want)  # exact, NaN where a window has one


def test_inputs_the_kernels_cannot_read_are_refused(harness: Harness) -> None:
    ops = _ops(harness)
    x = np.zeros((1, 4, 3, 3), np.float16)
    nhwc = _put_nhwc(harness, x)
    with pytest.raises(ValueError, match="channels_last"):
        ops.bias_silu_(harness.put(np.zeros((1, 4, 3, 5), np.float16)), harness.put(x[0, :, 0, 0]))
    with pytest.raises(ValueError, match="float16"):
        ops.bias_silu_(harness.put(np.zeros((1, 4, 3, 3), np.float32)), harness.put(x[0, :, 0, 0]))
    with pytest.raises(ValueError, match="bias"):
        ops.bias_silu_(nhwc, harness.put(np.zeros(3, np.float16)))
    with pytest.raises(ValueError, match="odd"):
        ops.max_pool_same(nhwc, _empty_nhwc(harness, (1, 4, 3, 3)), 4)
    with pytest.raises(ValueError, match="shape"):
        ops.max_pool_same(nhwc, _empty_nhwc(harness, (1, 4, 3, 4)), 3)
    with pytest.raises(ValueError, match="overlap"):
        ops.max_pool_same(nhwc, nhwc, 3)


@pytest.mark.gpu
def test_real_activations_of_the_demo_network(cuda_harness: Harness) -> None:
    """The demo network's SPPF input (for the pool) and the input of a conv + SiLU pair (for
    bias + SiLU), taken with forward hooks on a letterboxed sample frame."""
    torch = cuda_harness.torch
    from support.kernels.harness import DEMO_MODEL, SAMPLE_CLIP

    from vdet.inference.backends.torch import load_onnx_network
    from vdet.inference.preprocess import letterbox

    av = pytest.importorskip("av")
    with av.open(str(SAMPLE_CLIP)) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="bgr24")
    image, _ = letterbox(frame, (384, 640))
    network = load_onnx_network(DEMO_MODEL, batch=1, input_hw=(384, 640), layer_kernels="off")
    seen: dict[str, Any] = {}

    def keep(name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            seen.setdefault(name, (args[0].detach().clone(), output.detach().clone()))

        return hook

    pools = [m for m in network.modules() if isinstance(m, torch.nn.MaxPool2d)]
    pools[0].register_forward_hook(keep("pool"))
    # A conv of a C2f block, which a SiLU follows (the first conv with a bias is the stem).
    biased = [m for m in network.modules() if isinstance(m, torch.nn.Conv2d) and m.bias is not None]
    conv = biased[4]
    conv.register_forward_hook(keep("conv"))
    x = torch.from_numpy(image).to("cuda", torch.float16)[None]
    with torch.inference_mode():
        network(x.contiguous(memory_format=torch.channels_last))
    ops = _ops(cuda_harness)
    pool_in, pool_out = seen["pool"]
    out = torch.empty_like(pool_in, memory_format=torch.channels_last)
    ops.max_pool_same(pool_in, out, 5)
    torch.cuda.synchronize()
    assert torch.equal(out, pool_out)
    conv_in, conv_out = seen["conv"]
    unbiased = torch.nn.functional.conv2d(
        conv_in, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups
    ).contiguous(memory_format=torch.channels_last)
    want = silu_reference(
        (unbiased.float().cpu().numpy()).astype(np.float16), conv.bias.cpu().numpy()
    )
    ops.bias_silu_(unbiased, conv.bias.detach())
    torch.cuda.synchronize()
    assert _ulps(unbiased.cpu().numpy(), want) <= 1
    assert conv_out.shape == unbiased.shape


@pytest.mark.gpu
def test_the_demo_network_with_layer_kernels_finds_what_it_finds_without(
    cuda_harness: Harness,
) -> None:
    """Whole network, FP16 on the GPU, on sample frames: raw head within FP16 noise of the same
    network with torch's layers (box coordinates 1 px: FP16's spacing is 0.5 px above 512;
    scores 0.01), and the same clear detections."""
    torch = cuda_harness.torch
    from support.kernels.harness import DEMO_MODEL, SAMPLE_CLIP

    from vdet.inference.backends.torch import load_onnx_network
    from vdet.inference.backends.torch_layers import BiasSiLU, MaxPoolSame
    from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
    from vdet.inference.preprocess import letterbox

    av = pytest.importorskip("av")
    fast = load_onnx_network(DEMO_MODEL, batch=1, input_hw=(384, 640))
    plain = load_onnx_network(DEMO_MODEL, batch=1, input_hw=(384, 640), layer_kernels="off")
    kinds = [type(m) for m in fast.modules()]
    assert kinds.count(BiasSiLU) == 57 and kinds.count(MaxPoolSame) == 3
    with av.open(str(SAMPLE_CLIP)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index % 50:
                continue
            image, _ = letterbox(frame.to_ndarray(format="bgr24"), (384, 640))
            x = torch.from_numpy(image).to("cuda", torch.float16)[None]
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.inference_mode():
                got = fast(x).float().cpu().numpy()[0]
                want = plain(x).float().cpu().numpy()[0]
            np.testing.assert_allclose(got[:4], want[:4], atol=1.0, rtol=0)
            np.testing.assert_allclose(got[4:], want[4:], atol=0.01, rtol=0)
            params = PostprocessParams()
            found, _ = decode_and_nms_image(got, params)
            expected, _ = decode_and_nms_image(want, params)
            # Every clear detection (score 0.35+, away from the 0.25 threshold) of one is in
            # the other: same class, box edges within a pixel.
            for a, b in ((found, expected), (expected, found)):
                for box, score, cls in zip(a.xyxy, a.scores, a.class_ids, strict=True):
                    if score < 0.35:
                        continue
                    near = np.abs(b.xyxy - box).max(axis=1) <= 1.0
                    assert (near & (b.class_ids == cls)).any(), (index, box, score, cls)
            if index >= 250:
                break
