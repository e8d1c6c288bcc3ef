#!/usr/bin/env bash
# Create .venv and install vdet into it. Serving needs nothing else: PyAV's wheels carry FFmpeg.
#   scripts/setup.sh                  runtime only (vdet serve, detect, eval)
#   scripts/setup.sh --extras a,b     + optional extras of pyproject.toml, e.g. eval (vdet eval
#                                     --track), train (vdet export), quant (vdet quantize), gpu,
#                                     tensorrt-rtx, bench (vdet bench serve), report (plots)
#   scripts/setup.sh --dev            + test/lint tools, Ultralytics + CPU PyTorch (export, training),
#                                     NVIDIA ModelOpt (vdet quantize), onnx-graphsurgeon (vdet engine),
#                                     TensorRT for RTX (real engines built on the CPU in the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
case "${1:-}" in
  --dev) extras="dev,train,quant,tensorrt,tensorrt-rtx,eval" ;;
  --extras)
    extras="${2:?--extras needs a comma-separated list, e.g. --extras eval,train}"
    if [[ ! "$extras" =~ ^[a-z0-9,-]+$ ]]; then
      echo "scripts/setup.sh: --extras takes names like eval,train (got '$extras')" >&2
      exit 2
    fi ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--dev | --extras NAME[,NAME...]]" >&2; exit 2 ;;
esac
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [[ ",$extras," == *,train,* ]]; then
  # Ultralytics needs torchvision, and PyPI's torchvision only imports beside the matching
  # PyPI torch build: pin the pair (a CPU machine runs it on the CPU).
  python -m pip install -q --no-compile "torch==2.14.1" "torchvision==0.29.1"
fi
if [[ -n "$extras" ]]; then
  # --no-compile: pip byte-compiles every module it installs, one file after another (~16k
  # with the dev extras, about two minutes); scripts/test.sh compiles the environment on every
  # core while other setup runs (else Python compiles a module when it is first imported).
  python -m pip install -q --no-compile -e ".[$extras]"
else
  python -m pip install -q -e .
fi
if [[ "${1:-}" == "--dev" ]]; then
  # The torch backend's converter, so its CPU tests run here too (the rest of the gpu extra,
  # PyNvVideoCodec and CUDA bindings, only works on a machine with an NVIDIA driver).
  python -m pip install -q --no-compile "onnx2torch==1.5.15"
fi
echo "vdet installed in $(pwd)/.venv${extras:+ with extras $extras}"
