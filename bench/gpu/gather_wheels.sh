#!/usr/bin/env bash
# Gathers into DST (default .whl) the wheels an offline GPU machine whose image has PyTorch,
# NumPy, SciPy, Numba, OpenCV, Pillow, PyYAML, httpx, prometheus-client, psutil and ONNX Runtime
# lacks for vdet serve, its GPU tests and bench/gpu/run_session_device.sh (CPython 3.12, x86-64):
#   bash bench/gpu/gather_wheels.sh [DST] [EXTRA...]
# EXTRA: more requirements (e.g. py-spy for VDET_SERVE_PROFILE_S). PyNvVideoCodec is slimmed to
# its runtime files (no FFmpeg source tarball, samples, benchmarks, CUDA 12 build or duplicate
# library copies: 27 MB -> about 4 MB), then every wheel is recompressed with LZMA
# (bench/gpu/repack_wheels.py) to travel in less space.
set -euo pipefail
cd "$(dirname "$0")/../.."
dst=${1:-.whl}
shift || true
packages=(
  av pynvvideocodec onnx2torch nvidia-ml-py faster-coco-eval pytest-asyncio
  # the API and its server
  fastapi fastapi-offline starlette uvicorn httptools websockets python-multipart annotated-doc
  opentelemetry-api click tqdm paho-mqtt nats-py
  # vdet.config
  pydantic pydantic-core pydantic-settings typing-inspection annotated-types python-dotenv
  "$@"
)
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
platforms=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
  manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$raw" "${packages[@]}"
python3 - "$raw" <<'EOF'
"""Slim PyNvVideoCodec's wheel in place: its runtime files only, RECORD to match."""
import sys
import zipfile
from pathlib import Path

DROP = ("samples/", "benchmarks/", ".data/data/external/")
for wheel in Path(sys.argv[1]).glob("pynvvideocodec-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as zout:
        names = zin.namelist()

        def kept(name: str) -> bool:
            base = name.rsplit("/", 1)[-1]
            return not (
                any(d in name for d in DROP)
                or "_121." in base  # the CUDA 12 build; the image's CUDA is 13
                # copies of the FFmpeg libraries under other names: the extension loads *.so.N
                or base in ("libavformat.so", "libavutil.so")
                or base.startswith(("libavformat.so.63.", "libavutil.so.61."))
            )

        for name in names:
            if not kept(name):
                continue
            data = zin.read(name)
            if name.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if kept(r.split(",", 1)[0])).encode()
            zout.writestr(zin.getinfo(name), data)
    slim.replace(wheel)
EOF
rm -rf "$dst" && mkdir -p "$dst"
python3 bench/gpu/repack_wheels.py "$raw" "$dst"
du -sh "$dst"
