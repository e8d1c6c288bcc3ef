#!/usr/bin/env bash
# Resolve the GPU image's Python install line (deploy/Dockerfile.gpu) without installing it:
# pip's resolver picks every distribution and version from PyPI's metadata, so a conflict, a
# yanked or missing version, or an extra that lost a package fails here, not in a user's
# `docker build`. The multi-GB CUDA wheels are not downloaded (pip reads their metadata only).
# Then checks that the resolution holds the distributions whose modules the image imports at
# build time. Writes build/gpu-install-report.json (pip's installation report).
#   usage: deploy/check-gpu-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
torch=$(sed -n 's/^ARG TORCH_VERSION=//p' deploy/Dockerfile.gpu)
[[ -n $torch ]] || { echo "check-gpu-install: no ARG TORCH_VERSION in deploy/Dockerfile.gpu" >&2; exit 1; }
mkdir -p build
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
started=$SECONDS
"$venv/bin/pip" install -q --disable-pip-version-check --dry-run --ignore-installed \
  --report build/gpu-install-report.json "torch==$torch" ".[gpu,tensorrt-rtx,quant]"
python3 - "$torch" <<'PY'
import json
import sys

report = json.load(open("build/gpu-install-report.json"))
resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in report["install"]}
# The distributions behind the imports of the image's build-time check (Dockerfile.gpu's RUN).
needed = ["torch", "onnx2torch", "pynvvideocodec", "tensorrt-rtx-cu13-bindings",
          "tensorrt-rtx-cu13-libs", "nvidia-modelopt", "cuda-bindings", "nvidia-cuda-nvrtc", "vdet"]
missing = [name for name in needed if name not in resolved]
if missing:
    sys.exit(f"check-gpu-install: the GPU install line resolves without {missing}")
if resolved["torch"] != sys.argv[1]:
    sys.exit(f"check-gpu-install: torch resolved to {resolved['torch']}, not {sys.argv[1]}")
print(f"check-gpu-install: {len(resolved)} distributions resolved; "
      + ", ".join(f"{name} {resolved[name]}" for name in needed))
PY
echo "check-gpu-install: resolved in $((SECONDS - started)) s"
