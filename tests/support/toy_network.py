"""A stand-in detector network for the runners' CPU tests: what a YOLOv8 head looks like to them
((B, 4 + classes, anchors)), with outputs that depend on the image, and nothing to load."""

from __future__ import annotations

import torch


def toy_network(x: torch.Tensor) -> torch.Tensor:
    """3 fixed boxes (two overlapping) and 2 classes whose scores follow the image's channel
    means: (B, 3, H, W) -> (B, 6, 3)."""
    means = x.float().mean(dim=(2, 3))  # (B, 3)
    boxes = torch.tensor(
        [[16.0, 16.0, 12.0, 12.0], [17.0, 17.0, 12.0, 12.0], [48.0, 40.0, 20.0, 10.0]]
    ).T  # (4, 3)
    scores = torch.stack(
        (means, torch.stack((1 - means[:, 0], means[:, 2], 0.5 * means[:, 1]), dim=1)), dim=1
    )  # (B, 2 classes, 3 anchors)
    return torch.cat((boxes[None].expand(x.shape[0], 4, 3), scores), dim=1)
