#!/usr/bin/env bash
# Create .venv and install vdet into it. Serving needs nothing else: PyAV's wheels carry FFmpeg.
#   scripts/setup.sh            runtime only (vdet serve, detect, eval)
#   scripts/setup.sh --dev      + test/lint tools, Ultralytics + CPU PyTorch (export, training),
#                               NVIDIA ModelOpt (vdet quantize), onnx-graphsurgeon (vdet engine),
#                               TensorRT for RTX (real engines built on the CPU in the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [[ "${1:-}" == "--dev" ]]; then
  # --no-compile: pip byte-compiles every module it installs, one file after another (~16k
  # here, about two minutes); scripts/test.sh compiles the environment on every core while
  # other setup runs (else Python compiles a module when it is first imported).
  # Ultralytics needs torchvision, and PyPI's torchvision only imports beside the matching
  # PyPI torch build: pin the pair (a CPU machine runs it on the CPU).
  python -m pip install -q --no-compile "torch==2.14.1" "torchvision==0.29.1"
  python -m pip install -q --no-compile -e ".[dev,train,quant,tensorrt,tensorrt-rtx,eval]"
  # The torch backend's converter, so its CPU tests run here too (the rest of the gpu extra,
  # PyNvVideoCodec and CUDA bindings, only works on a machine with an NVIDIA driver).
  python -m pip install -q --no-compile "onnx2torch==1.5.15"
else
  python -m pip install -q -e .
fi
echo "vdet installed in $(pwd)/.venv"
