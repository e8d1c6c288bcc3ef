"""Which network input (H, W) a frame runs at on the GPU path (setting `input_shape`).

With `rect`, a frame runs at the smallest stride-multiple input that holds it (384x640 for 16:9
at a 640 model, 480x640 for 4:3), where the network takes such inputs; with `square` (or a
network that does not), at the model's input size. The numbers come from vdet.core.contract; this
module only chooses, per frame size, and builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from vdet.core.contract import STRIDE, rect_input_hw

# The frame size most cameras send; its input shape is ready before the first frame.
COMMON_SOURCE_WH = (1920, 1080)


@dataclass(frozen=True)
class InputShapes:
    """Which network input (H, W) a frame of a given size runs at on the GPU path.

    `model_hw` is the model's input size and `stride` its largest stride. With `rect`, a frame
    gets `rect_input_hw` of its size (the smallest stride multiple that holds it at the scale
    the model's input gives it), raised to at least `min_hw` where the networks take nothing
    smaller (a TensorRT profile's minimum; the letterbox then pads more, at the same scale);
    without it, every frame runs at `model_hw`.
    """

    model_hw: tuple[int, int]
    stride: int = STRIDE
    rect: bool = False
    min_hw: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        H, W = self.model_hw
        if H < 1 or W < 1:
            raise ValueError(f"model input {self.model_hw} must be positive")
        if self.rect and (self.stride < 1 or H % self.stride or W % self.stride):
            raise ValueError(
                f"rect inputs need a model input {self.model_hw} that is a multiple of the "
                f"stride {self.stride}"
            )
        if self.min_hw is not None and not all(
            0 < low <= side for low, side in zip(self.min_hw, self.model_hw, strict=True)
        ):
            raise ValueError(f"min_hw {self.min_hw} must lie within the model input")

    def of(self, source_wh: tuple[int, int]) -> tuple[int, int]:
        """The input (H, W) a frame of `source_wh` is letterboxed into."""
        if not self.rect:
            return self.model_hw
        H, W = rect_input_hw(source_wh, self.model_hw, self.stride)
        if self.min_hw is not None:
            H, W = max(H, self.min_hw[0]), max(W, self.min_hw[1])
        return H, W

    def describe(self) -> str:
        return "rect inputs" if self.rect else "square inputs"


def has_rect_inputs(model_hw: tuple[int, int], stride: int) -> bool:
    """Whether a model of `model_hw` has rectangular inputs at all (sides multiples of the
    stride; the rest run square)."""
    return stride >= 1 and all(side >= stride and side % stride == 0 for side in model_hw)


__all__ = ["COMMON_SOURCE_WH", "InputShapes", "has_rect_inputs"]
