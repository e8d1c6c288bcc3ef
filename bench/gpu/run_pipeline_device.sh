#!/usr/bin/env bash
# The GPU data path (NVDEC ingest, torch backend, CUDA-graph runners) in one run on an offline
# GPU machine:
#   1. install the wheels copied into .whl/ (pynvvideocodec 2.2.4, onnx2torch 1.5.15; pytest-asyncio if
#      present) and vdet itself into /tmp/site;
#   2. pytest -m gpu on tests/gpu/test_gpu_nvdec.py and tests/gpu/test_gpu_torch_backend.py
#      (--confcutdir keeps tests/conftest.py, which needs PyAV, out of the run);
#   3. bench/gpu/pipeline.py -> gpu_pipeline.json.
# Logs and JSON go to $OUT (or /tmp/vdet-out); the test summary and a short table print last.
#   run: bash bench/gpu/run_pipeline_device.sh      (with .whl/ holding just those wheels)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/vdet-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 YOLO_OFFLINE=1
SITE=${VDET_SITE:-/tmp/site}
WHEELS=${VDET_WHEELS:-.whl}

{
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl
  fi
  if ! python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade \
      --target "$SITE" .; then
    # pip could not build here: import vdet from the checkout (service/ holds the package).
    echo "pip install of vdet failed; importing it from service/ instead"
    source_path=:$PWD/service
  fi
} >"$OUT/install_pipeline.log" 2>&1
export PYTHONPATH=$SITE${source_path:-}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, onnxruntime, cv2; print(sys.version); \
print('torch', torch.__version__, 'ort', onnxruntime.__version__, 'cv2', cv2.__version__)"
  python3 -c "import PyNvVideoCodec as n; print('PyNvVideoCodec', n.__version__)"
  python3 -c "import onnx2torch; print('onnx2torch ok')"
  python3 -c "import vdet.ingest.nvdec as m; print('nvdec available', m.nvdec_available())"
} >"$OUT/env_pipeline.txt" 2>&1
cat "$OUT/env_pipeline.txt"

pytest_args=(-m gpu tests/gpu/test_gpu_nvdec.py tests/gpu/test_gpu_torch_backend.py
  -q -rs -p no:cacheprovider --confcutdir=tests/gpu --junitxml="$OUT/junit_pipeline.xml")
if ! python3 -c "import pytest_asyncio" 2>/dev/null; then
  pytest_args+=(-p no:asyncio -W ignore::pytest.PytestConfigWarning)
fi
timeout 330 python3 -m pytest "${pytest_args[@]}" >"$OUT/pytest_pipeline.log" 2>&1
pytest_rc=$?

timeout 200 python3 bench/gpu/pipeline.py --out "$OUT/gpu_pipeline.json" \
  >"$OUT/bench_pipeline.log" 2>&1
bench_rc=$?

tail -n 60 "$OUT/pytest_pipeline.log"
tail -n 14 "$OUT/bench_pipeline.log"
echo "pytest rc=$pytest_rc bench rc=$bench_rc"
exit $((pytest_rc != 0 || bench_rc != 0))
