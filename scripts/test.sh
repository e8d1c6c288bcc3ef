#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian machine, then lint, type-check and test.
# GPU (-m gpu) and TensorRT (-m tensorrt) tests skip themselves where those are absent.
# Last, deploy/podman/ci-stack.sh builds the compose stack's images and runs the stack with
# Podman (about 3 minutes; VDET_STACK=0 leaves it out, and it skips itself without Podman).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(grep -v '^#' .ci/system-packages.txt) >/dev/null
  # The system packages are in, Podman among them: the stack check must run, not skip.
  export VDET_STACK_REQUIRED=1
fi
scripts/setup.sh --dev
. .venv/bin/activate
ruff check service engines plugins tests deploy
ruff format --check service engines plugins tests deploy
mypy -p vdet
python -m pytest -q -p no:cacheprovider "$@"
if [[ "${VDET_STACK:-1}" != 0 ]]; then
  deploy/podman/ci-stack.sh
fi
