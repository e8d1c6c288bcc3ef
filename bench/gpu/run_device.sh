#!/usr/bin/env bash
# Everything GPU-side for the CUDA kernels in one run on an offline GPU machine:
#   1. install the wheels copied into .whl/ (PyAV for the sample clip, pytest-asyncio for the
#      project's pytest config) and vdet itself into /tmp/site;
#   2. pytest -m gpu on the kernel tests (their [cuda] half; VDET_GPU_TESTS widens it);
#   3. the kernel micro-benchmarks (bench/gpu/kernels.py -> kernels.json);
#   4. if time is left, compute-sanitizer memcheck and racecheck on small runs of every kernel.
# Logs and JSON go to $OUT (or /tmp/vdet-out); a short table is printed last.
#   run: bash bench/gpu/run_device.sh      (with .whl/ copied along)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/vdet-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/vdet-cache YOLO_OFFLINE=1
SITE=${VDET_SITE:-/tmp/site}
started=$SECONDS

# ---- 1. install -----------------------------------------------------------------------------
{
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl
  fi
  if ! python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade \
      --target "$SITE" .; then
    # pip could not build here: import vdet from the checkout (service/ holds the package).
    echo "pip install of vdet failed; importing it from service/ instead"
    source_path=:$PWD/service
  fi
} >"$OUT/install.log" 2>&1
export PYTHONPATH=$SITE${source_path:-}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import sys, torch, cuda.bindings, cv2, numpy, pytest; print(sys.version); \
print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__, 'cv2', cv2.__version__, \
'numpy', numpy.__version__, 'pytest', pytest.__version__)"
  python3 -c "import av; print('av', av.__version__)"
  python3 -c "import vdet.cuda.ops as o; print('vdet kernels at', o.__file__)"
  python3 -c "from vdet.cuda.launch import kernel_sources as k; print(*sorted(k()))"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# ---- 2. tests -------------------------------------------------------------------------------
# The kernel tests by default; VDET_GPU_TESTS=tests/gpu runs every GPU test of the folder.
read -r -a test_paths <<<"${VDET_GPU_TESTS:-tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_host.py}"
pytest_args=(-m gpu "${test_paths[@]}" -q -p no:cacheprovider --junitxml="$OUT/junit.xml")
if ! python3 -c "import pytest_asyncio" 2>/dev/null; then
  # Without the plugin the project's asyncio_* ini keys are unknown: ignore that warning only.
  pytest_args+=(-p no:asyncio -W ignore::pytest.PytestConfigWarning)
fi
timeout 140 python3 -m pytest "${pytest_args[@]}" >"$OUT/pytest.log" 2>&1
pytest_rc=$?
tail -n 40 "$OUT/pytest.log"

# ---- 3. benchmarks --------------------------------------------------------------------------
timeout 100 python3 bench/gpu/kernels.py --out "$OUT/kernels.json" >"$OUT/bench.log" 2>&1
bench_rc=$?

# ---- 4. sanitizer (best effort) -------------------------------------------------------------
if (( SECONDS - started < 200 )) && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout 30 compute-sanitizer --tool "$tool" python3 bench/gpu/sanitize_check.py 2>&1 | tail -n 6
  done >"$OUT/sanitizer.log" 2>&1
else
  echo "skipped: $((SECONDS - started)) s used" >"$OUT/sanitizer.log"
fi

# ---- summary --------------------------------------------------------------------------------
echo
echo "== sanitizer"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize_check|skipped|Error|error" "$OUT/sanitizer.log" | head -n 8
echo "== pytest (rc $pytest_rc)"
grep -E "passed|failed|error" "$OUT/pytest.log" | tail -n 1
echo "== benchmarks (rc $bench_rc), $((SECONDS - started)) s in all"
tail -n 30 "$OUT/bench.log"
