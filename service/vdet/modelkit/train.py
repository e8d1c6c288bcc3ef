"""Train the demo detector on synthetic scenes, then export it to ONNX.

    python -m vdet.modelkit.train --out runs/demo --model yolov8n.yaml --minutes 6.5 --device 0

Renders the dataset (train and validation seeds never overlap with the held-out evaluation
seeds used by `vdet eval`), trains an Ultralytics YOLOv8 from scratch (no pretrained weights can
be downloaded here), and exports `best.pt` to `<out>/demo.onnx`. Everything is seeded; the
exact command used for the committed model is recorded in its model card.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from vdet.core.contract import INPUT_SIZE
from vdet.modelkit.dataset.synthetic import SceneConfig
from vdet.modelkit.dataset.writers import write_dataset
from vdet.modelkit.export import export_onnx

TRAIN_SEED_BASE = 0
VAL_SEED_BASE = 5_000_000
HELDOUT_SEED_BASE = 9_000_000  # reserved for `vdet eval`; never trained or validated on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="yolov8n.yaml")
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--val-images", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training")
    parser.add_argument("--imgsz", type=int, default=INPUT_SIZE)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 8)
    parser.add_argument("--device", default="0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO  # type: ignore[attr-defined]

    data_root = args.out / "data"
    t0 = time.time()
    write_dataset(
        data_root,
        {
            "train": range(TRAIN_SEED_BASE, TRAIN_SEED_BASE + args.train_images),
            "val": range(VAL_SEED_BASE, VAL_SEED_BASE + args.val_images),
        },
        SceneConfig(),
        workers=args.workers,
    )
    t_data = time.time() - t0
    model = YOLO(args.model)
    train_args = dict(
        data=str(data_root / "data.yaml"),
        epochs=args.epochs,
        imgsz=args.imgsz,
        batch=args.batch,
        workers=args.workers,
        device=args.device,
        seed=args.seed,
        deterministic=False,  # deterministic cuDNN costs speed; the data itself is seeded
        pretrained=False,
        cache="ram",
        project=str(args.out.resolve()),
        name="train",
        exist_ok=True,
        plots=False,
        amp=True,
        # Colour carries class identity here: keep hue still and never swap channels.
        hsv_h=0.0,
        hsv_s=0.3,
        hsv_v=0.3,
        bgr=0.0,
        fliplr=0.5,
        mosaic=1.0,
        close_mosaic=10,
        scale=0.5,
        patience=1000,
    )
    if args.minutes:
        train_args["time"] = args.minutes / 60
    t1 = time.time()
    model.train(**train_args)
    t_train = time.time() - t1
    best = args.out / "train" / "weights" / "best.pt"
    info = export_onnx(best, args.out / "demo.onnx", imgsz=args.imgsz, dynamic_batch=True)
    record = {
        "command": "python -m vdet.modelkit.train " + " ".join(argv or sys.argv[1:]),
        "train_args": {k: v for k, v in train_args.items() if k not in {"data", "project"}},
        "train_images": args.train_images,
        "val_images": args.val_images,
        "dataset_seconds": round(t_data, 1),
        "train_seconds": round(t_train, 1),
        "classes": list(info.names),
        "onnx_sha256": info.sha256,
    }
    (args.out / "train_record.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
