#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian machine, then lint, type-check and test.
# GPU (-m gpu) and TensorRT (-m tensorrt) tests skip themselves where those are absent.
# deploy/podman/ci-stack.sh builds the compose stack's images with Podman from the start, at the
# lowest CPU priority, and runs the stack last (CI_STACK=0 leaves it out; without Podman it
# says SKIP): the builds take the time setup and the tests spend waiting (downloads, servers,
# subprocesses), not theirs. No test uses Podman.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the time goes, in the log: each phase's end, in seconds since the start.
phase() { echo "[test.sh] $1 at ${SECONDS} s"; }
# A full run writes about 15 GB (the environment 7.5 GB, the stack images and their builds): on
# a fuller disk a failure later reads "No space left on device"; this line says why up front.
free_gb=$(($(df -Pk . | awk 'NR == 2 {print $4}') / 1024 / 1024))
echo "[test.sh] ${free_gb} GB free on the disk of $(pwd)"
((free_gb >= 15)) || echo "[test.sh] WARNING: under 15 GB free; the run may stop for space" >&2
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(grep -v '^#' .ci/system-packages.txt) >/dev/null
  # The system packages are in, Podman among them: the stack check must run, not skip.
  # (Not VDET_*: vdet refuses VDET_ variables it does not know, and the tests run vdet.)
  export CI_STACK_REQUIRED=1
  phase "system packages"
fi
# The GPU image's install line, resolved from PyPI's metadata (no GPU, no multi-GB download):
# mostly waiting on the network, so it too runs beside setup.
mkdir -p build
deploy/check-gpu-install.sh >build/gpu-install.log 2>&1 &
gpu_install=$!
stack=${CI_STACK:-1}
if [[ $stack != 0 ]]; then
  mkdir -p build
  nice -n 19 deploy/podman/ci-stack.sh build >build/stack-build.log 2>&1 &
  stack_build=$!
  trap 'kill "$stack_build" "$gpu_install" 2>/dev/null || true' EXIT
else
  trap 'kill "$gpu_install" 2>/dev/null || true' EXIT
fi
scripts/setup.sh --dev
phase "Python environment"
. .venv/bin/activate
ruff check service plugins tests deploy bench
ruff format --check service plugins tests deploy bench
phase "lint"
# setup.sh --dev installs without byte-compiling (pip compiles one file after another): the
# environment is compiled here on every core, while the stack images finish building, and
# before the tests (whose subprocesses would otherwise each compile what they import first).
python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null 2>&1 &
compiling=$!
# The type check (about a minute of one core) runs beside the tests at the lowest CPU priority:
# it takes the time the tests spend waiting on servers and subprocesses, not theirs. Its output
# and status are reported after the tests.
# bench/ holds plain scripts, not a package: mypy names each by its file and finds a script's
# neighbour beside it (bench/gpu/wait_probe.py imports accuracy.py); vdet comes from the cache.
nice -n 19 bash -c 'mypy -p vdet && mypy bench' >build/mypy.log 2>&1 &
types=$!
trap 'kill ${stack_build:-} "$gpu_install" "$compiling" "$types" 2>/dev/null || true' EXIT
install_status=0
wait "$gpu_install" || install_status=$?
grep -v '^WARNING: Location' build/gpu-install.log || true
((install_status == 0)) || exit "$install_status"
phase "GPU install line checked"
wait "$compiling" || true  # (a file that does not compile is the import's problem, not this)
phase "environment compiled"
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
phase "tests"
types_status=0
wait "$types" || types_status=$?
cat build/mypy.log
((types_status == 0)) || exit "$types_status"
phase "types"
if [[ $stack != 0 ]]; then
  build_status=0
  wait "$stack_build" || build_status=$?
  cat build/stack-build.log
  ((build_status == 0)) || exit "$build_status"
  phase "stack images built"
  deploy/podman/ci-stack.sh run
  phase "stack run"
fi
