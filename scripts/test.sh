#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian machine, then lint, type-check and test.
# GPU (-m gpu) and TensorRT (-m tensorrt) tests skip themselves where those are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(grep -v '^#' .ci/system-packages.txt) >/dev/null
fi
scripts/setup.sh --dev
. .venv/bin/activate
ruff check service engines plugins tests
ruff format --check service engines plugins tests
mypy -p vdet
python -m pytest -q -p no:cacheprovider "$@"
