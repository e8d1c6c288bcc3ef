#!/usr/bin/env bash
# Every GPU-side check and benchmark of vdet, in phases that each fit one ten-minute run on an offline GPU machine:
#   tests     install + pytest -m gpu tests/gpu (kernels, NVDEC, torch backend, the serve path),
#             the TensorRT plugin harness (bench/gpu/run_plugin_device.sh, when .trt-include is
#             there), the kernel micro-benchmarks and the frame -> detections pipeline bench
#   streams   install + bench/gpu/streams.py: paced/unpaced many-stream runs and their peers
#   stability install + bench/gpu/streams.py: one long 32-stream run sampling RSS and GPU memory
#   main      the tests phase's pytest, the YOLOv8s pipeline sections and the streams runs
#   retest    the tests phase's pytest, the YOLOv8s pipeline sections and the stability run
# Wheels copied into .whl/: av, pynvvideocodec (slimmed: no sources, samples or CUDA 12 build),
# onnx2torch, pytest-asyncio, ultralytics, nvidia-ml-py, psutil, and what vdet.config needs
# (pydantic, pydantic-core, pydantic-settings, typing-inspection, annotated-types,
# python-dotenv, pyyaml).
#   diagnose  install + the accuracy probe (bench/gpu/accuracy.py), the demo's graph launch,
#             chosen many-stream runs ($VDET_RUNS, with thread-stack and GIL diagnostics) and
#             the GPU tests in what is left
#   final     wait probe (who spins), memcheck, the stability run, 64 streams x 8 processes
#   verify    the GPU tests, then $VDET_RUNS (default: 64 streams in one and in several
#             processes, their ceilings, one stream against Ultralytics)
#   scale     the GPU tests, then 64 streams over processes with and without MPS
#   gil       which calls hold the GIL while waiting; 64 streams over 16 and 8 MPS processes
#   buckets   the GPU tests, then batched (a graph per bucket) against batch-1 64-stream runs
#   loops     NVDEC GPU tests, then 64 paced streams: a session per looped pass against one
#   batcher   the GPU tests, then batched (threads stage their own frames) against batch 1
#   ceiling   the batched graphs alone (inference ceiling), then unpaced batched 64 streams
#   runs      only the many-stream runs named in $VDET_RUNS
#   workers   vdet serve with worker processes on the GPU, then the GPU tests
#   serve     the worker-process GPU tests, then vdet bench serve (workers vs shards; one
#             worker killed mid-window at 64 streams)
# JSON and logs are written under /tmp/vdet-out; when the caller sets $OUT (a folder copied back
# from the GPU machine, best kept to a few files), they are packed there as ONE tarball,
# $OUT/results-<phase>.tgz. The last lines printed are a short summary.
#   run: bash bench/gpu/run_session_device.sh tests|streams|stability|main|retest|diagnose
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
phase=${1:?tests, streams, stability, main, retest or diagnose}
DEST=${OUT:-}
OUT=/tmp/vdet-out
mkdir -p "$OUT"
pack() { [ -n "$DEST" ] && tar czf "$DEST/results-$phase.tgz" -C "$OUT" . ; }
trap pack EXIT
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 VDET_KERNEL_CACHE=/tmp/vdet-kernels
SITE=/tmp/site
started=$SECONDS
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade \
    --target "$SITE" .
} >"$OUT/install-$phase.log" 2>&1 || { echo "install failed"; tail -n 20 "$OUT/install-$phase.log"; }
export PYTHONPATH=$SITE

# gpu_tests SECONDS: pytest -m gpu tests/gpu, its summary printed.
gpu_tests() {
  timeout "$1" python3 -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider \
    --junitxml="$OUT/junit.xml" >"$OUT/pytest.log" 2>&1
  echo "pytest rc=$? ($((SECONDS - started)) s)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -n 12
}

# stream_runs SECONDS RUNS LINES: bench/gpu/streams.py --runs RUNS, 8 s windows.
stream_runs() {
  timeout "$1" python3 bench/gpu/streams.py --runs "$2" --seconds 8 --run-timeout 50 \
    --out "$OUT/streams.json" >"$OUT/streams.log" 2>&1
  echo "streams rc=$? ($((SECONDS - started)) s)"
  tail -n "$3" "$OUT/streams.log"
}
# stability_run SECONDS RUN_TIMEOUT: 32 paced streams in one process for
# $VDET_STABILITY_SECONDS (default 300), sampling RSS and GPU memory.
stability_run() {
  timeout "$1" python3 bench/gpu/streams.py --out "$OUT/stability.json" --only stability \
    --sources 32 --decode-sources "" --unpaced-sources "" --no-peers \
    --stability-seconds "${VDET_STABILITY_SECONDS:-300}" --run-timeout "$2" \
    >"$OUT/stability.log" 2>&1
  echo "stability rc=$? ($((SECONDS - started)) s)"
  tail -n 6 "$OUT/stability.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "install: $((SECONDS - started)) s"

case $phase in
workers)
  # `vdet serve` with stream worker processes on the GPU (the real entry point), then the
  # rest of the GPU tests in what is left.
  export PATH="$SITE/bin:$PATH"
  timeout 300 python3 -m pytest -m gpu tests/gpu/test_gpu_workers_serve.py -q -s -rs \
    -p no:cacheprovider >"$OUT/workers.log" 2>&1
  echo "workers rc=$? ($((SECONDS - started)) s)"
  cp /tmp/pytest-of-*/pytest-*/gpu_workers*/vdet-*.log "$OUT/" 2>/dev/null
  grep -E "mps=|published again|stopped in|passed|failed|Error|assert" "$OUT/workers.log" | tail -n 20
  [ -z "${VDET_WORKERS_ONLY:-}" ] && gpu_tests $((570 - (SECONDS - started)))
  ;;
serve)
  # vdet serve as users run it, installed in a venv over the image's torch: the GPU
  # worker-process tests (kill -9 and the restart, SIGTERM), then `vdet bench serve` with worker
  # processes at $VDET_SERVE_STREAMS beside the hand-made shards of the same run, in what is
  # left of $VDET_SERVE_BUDGET seconds. In the steps of $VDET_SERVE_KILL_STREAMS (default 64;
  # those not in $VDET_SERVE_STREAMS are left out) one worker is killed with SIGKILL
  # $VDET_SERVE_KILL_AFTER seconds (default 3) into the window; either one empty: no kill.
  # This script's knobs are read here and dropped: vdet serve refuses unknown VDET_ variables.
  budget=${VDET_SERVE_BUDGET:-500} tests_s=${VDET_WORKERS_TESTS_S:-200}
  streams=${VDET_SERVE_STREAMS:-64,96} shards=${VDET_SHARDS_HARNESS-b1:x8:mps}
  kill_after=${VDET_SERVE_KILL_AFTER-3} kill_streams=${VDET_SERVE_KILL_STREAMS-64}
  unset VDET_SERVE_BUDGET VDET_WORKERS_TESTS_S VDET_SERVE_STREAMS VDET_SHARDS_HARNESS \
    VDET_SERVE_KILL_AFTER VDET_SERVE_KILL_STREAMS
  kill_in=""
  for n in ${kill_streams//,/ }; do
    [[ ",$streams," == *",$n,"* ]] && kill_in+="${kill_in:+,}$n"
  done
  kill_args=()
  [ -n "$kill_after" ] && [ -n "$kill_in" ] &&
    kill_args=(--kill-worker-after "$kill_after" --kill-worker-streams "$kill_in")
  unset PYTHONPATH  # else the venv's pip takes /tmp/site's wheels as already installed
  python3 -m venv /tmp/venv  # the image's own packages (torch, numpy, ...) through a .pth
  python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth"
  /tmp/venv/bin/python -m pip install -q --no-index --no-deps --no-compile .whl/*.whl \
    >>"$OUT/install-$phase.log" 2>&1
  # Editable, so that `--shards-harness` finds bench/gpu/streams.py of this checkout; the code
  # served is the same files either way.
  /tmp/venv/bin/python -m pip install -q --no-deps --no-build-isolation --no-compile -e . \
    >>"$OUT/install-$phase.log" 2>&1
  export PATH="/tmp/venv/bin:$PATH"
  timeout "$tests_s" /tmp/venv/bin/python -m pytest -m gpu \
    tests/gpu/test_gpu_workers_serve.py -q -s -rs -p no:cacheprovider >"$OUT/workers.log" 2>&1
  echo "workers rc=$? ($((SECONDS - started)) s)"
  cp /tmp/pytest-of-*/pytest-*/gpu_workers*/vdet-*.log "$OUT/" 2>/dev/null
  grep -E "mps=|published again|stopped in|passed|failed|Error|assert" "$OUT/workers.log" | tail -n 12
  timeout $((budget - (SECONDS - started))) /tmp/venv/bin/vdet bench serve --backend torch \
    --streams "$streams" --duration 10 --clients 4 \
    --variant "workers:workers.processes=auto" ${shards:+--shards-harness "$shards"} \
    "${kill_args[@]}" --output "$OUT/serve.json" >"$OUT/serve.log" 2>&1
  echo "bench serve rc=$? ($((SECONDS - started)) s)"
  tail -n 25 "$OUT/serve.log"
  ;;
tests)
  gpu_tests 230
  if [ -d .trt-include ]; then
    timeout 120 bash bench/gpu/run_plugin_device.sh >"$OUT/plugin_run.log" 2>&1
    echo "plugin harness rc=$? ($((SECONDS - started)) s)"
  fi
  timeout 90 python3 bench/gpu/kernels.py --out "$OUT/kernels.json" >"$OUT/kernels.log" 2>&1
  echo "kernels rc=$? ($((SECONDS - started)) s)"
  timeout $((560 - (SECONDS - started))) python3 bench/gpu/pipeline.py \
    --sections graph,graph_cuda,eager_cuda,ultralytics,memory,nvdec \
    --out "$OUT/gpu_pipeline.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  echo "== plugin"
  tail -n 12 "$OUT/plugin_run.log" 2>/dev/null
  echo "== kernels"
  tail -n 16 "$OUT/kernels.log"
  echo "== pipeline"
  tail -n 16 "$OUT/pipeline.log"
  ;;
streams)
  timeout 570 python3 bench/gpu/streams.py --out "$OUT/streams.json" --seconds 10 \
    >"$OUT/streams.log" 2>&1
  echo "streams rc=$? ($((SECONDS - started)) s)"
  tail -n 30 "$OUT/streams.log"
  ;;
main)
  # The GPU tests, the YOLOv8s frame -> detections figures and the main many-stream runs.
  gpu_tests 200
  timeout 75 python3 bench/gpu/kernels.py --out "$OUT/kernels.json" >"$OUT/kernels.log" 2>&1
  echo "kernels rc=$? ($((SECONDS - started)) s)"
  grep -E "decode_nms/vdet_dense|kernel_breakdown_dense" "$OUT/kernels.log"
  timeout 100 python3 bench/gpu/pipeline.py --no-demo --sections graph_cuda,ultralytics \
    --out "$OUT/gpu_pipeline_yolov8s.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  tail -n 6 "$OUT/pipeline.log"
  timeout $((590 - (SECONDS - started))) python3 bench/gpu/streams.py \
    --out "$OUT/streams.json" --seconds 10 --sources 1,32,64 --batches 1,8 \
    --run-timeout 60 >"$OUT/streams.log" 2>&1
  echo "streams rc=$? ($((SECONDS - started)) s)"
  tail -n 22 "$OUT/streams.log"
  ;;
retest)
  # The long stability run first (it needs its whole duration), then the GPU tests and the
  # YOLOv8s pipeline sections in what is left of the call.
  stability_run 380 60
  gpu_tests $((480 - (SECONDS - started)))
  timeout $((585 - (SECONDS - started))) python3 bench/gpu/pipeline.py --no-demo \
    --sections graph_cuda,ultralytics,graph \
    --out "$OUT/gpu_pipeline_yolov8s.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  tail -n 8 "$OUT/pipeline.log"
  ;;
stability)
  # The long run first, then (the launcher changed with the faster top-k) the plugin harness
  # and compute-sanitizer on the kernels, in what is left.
  stability_run 380 60
  if [ -d .trt-include ] && (( SECONDS - started < 480 )); then
    timeout 90 bash bench/gpu/run_plugin_device.sh >"$OUT/plugin_run.log" 2>&1
    echo "plugin harness rc=$? ($((SECONDS - started)) s)"
    tail -n 6 "$OUT/plugin_run.log"
  fi
  for tool in memcheck racecheck; do
    if (( SECONDS - started < 560 )); then
      timeout 30 compute-sanitizer --tool "$tool" python3 bench/gpu/sanitize_check.py 2>&1 \
        | tail -n 3
    fi
  done
  ;;
diagnose)
  timeout 100 python3 bench/gpu/accuracy.py --out "$OUT/accuracy.json" >"$OUT/accuracy.log" 2>&1
  echo "accuracy rc=$? ($((SECONDS - started)) s)"
  tail -n 3 "$OUT/accuracy.log"
  timeout 60 python3 bench/gpu/pipeline.py --no-yolov8s --sections graph_cuda,eager_cuda \
    --out "$OUT/gpu_pipeline_demo.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  tail -n 5 "$OUT/pipeline.log"
  stream_runs $((420 - (SECONDS - started))) "${VDET_RUNS:-decode_only:64:u:spin:diag \
decode_only:64:u:block:diag vdet:64:p:1:block:diag vdet:64:p:8 vdet:64:u:8 vdet:1:p \
vdet:64:p:1:spin vdet:32:p}" 14
  gpu_tests $((575 - (SECONDS - started)))
  ;;
verify)
  # The GPU tests first (the code under test changed), then the many-stream runs, single
  # process and split over processes, in what is left.
  gpu_tests 150
  stream_runs $((580 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:p:x4 decode_only:64:u:x4 \
vdet:64:u:x4 vdet:64:p:diag vdet:1:p ultralytics:1:p decode_only:64:u vdet:64:p:x8 vdet:32:p \
vdet:64:p:b8:x4}" 20
  ;;
scale)
  # The GPU tests, then 64 streams over several processes with and without MPS (one GPU
  # context shared by the processes), beside the decode-only ceiling, GPU and NVDEC busy.
  command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not found"
  gpu_tests 150
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:p:x8:mps vdet:64:p:x8 \
decode_only:64:u:x8 vdet:64:u:x8:mps decode_only:64:p:x8 vdet:64:p:x4:mps vdet:64:p:b8:x8:mps}" 24
  ;;
gil)
  # Does a call hold the GIL while it waits (NVDEC Decode, a stream's frame), then 64 streams
  # over 16 processes (4 streams each) beside 8, with MPS, and their decode-only peers.
  timeout 90 python3 bench/gpu/wait_probe.py --sections gil --out "$OUT/gil_probe.json" \
    >"$OUT/gil_probe.log" 2>&1
  echo "gil probe rc=$? ($((SECONDS - started)) s)"
  tail -n 4 "$OUT/gil_probe.log"
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:p:x16:mps \
decode_only:64:p:x16 vdet:64:p:x8:mps vdet:64:u:x16:mps decode_only:64:u:x16 vdet:32:p:x8:mps}" 22
  ;;
buckets)
  # The GPU tests (batched runner buckets), then batched against batch-1 runs of 64 streams
  # over MPS processes, unpaced beside the decode-only ceiling.
  gpu_tests 110
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:p:b8:x8:mps \
vdet:64:p:x8:mps vdet:64:p:b8:x4:mps vdet:64:u:b8:x8:mps decode_only:64:u:x8}" 20
  ;;
loops)
  # NVDEC's GPU tests (a looped clip in one session), then paced 64 streams with a session
  # per looped pass against one session throughout, decode-only and with inference (MPS).
  timeout 120 python3 -m pytest -m gpu tests/gpu/test_gpu_nvdec.py -q -rs -p no:cacheprovider \
    >"$OUT/pytest-nvdec.log" 2>&1
  echo "pytest nvdec rc=$? ($((SECONDS - started)) s)"
  tail -n 3 "$OUT/pytest-nvdec.log"
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:-decode_only:64:p:x8 \
decode_only:64:p:x8:passsess vdet:64:p:x8:mps vdet:64:p:x8:mps:passsess vdet:64:p:x16:mps \
decode_only:64:u:x16 vdet:64:u:x16:mps}" 22
  ;;
batcher)
  # The GPU tests (the batched runner's stage / launch / finish and the batcher behind the
  # serve path), then batched against batch-1 runs beside the decode-only ceiling.
  gpu_tests 170
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:-vdet:8:u:b8 vdet:8:u \
decode_only:64:u:x16 vdet:64:u:b8:x8:mps vdet:64:u:x16:mps vdet:64:p:b8:x8:mps vdet:64:p:x8:mps \
decode_only:64:p:x8}" 24
  ;;
ceiling)
  # The batched graphs alone (no decode): how many frames per second the GPU infers, then
  # unpaced 64 streams batched over 4 and 8 MPS processes beside the decode-only ceiling.
  timeout 150 python3 bench/gpu/inference_ceiling.py --out "$OUT/ceiling.json" \
    >"$OUT/ceiling.log" 2>&1
  echo "ceiling rc=$? ($((SECONDS - started)) s)"
  tail -n 14 "$OUT/ceiling.log"
  stream_runs $((340 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:u:b16:x4:mps \
decode_only:64:u:x8 vdet:64:u:b8:x8:mps}" 12
  ;;
runs)
  # Only the many-stream runs named in $VDET_RUNS.
  stream_runs $((585 - (SECONDS - started))) "${VDET_RUNS:?name the runs}" 20
  ;;
final)
  # Who spins while waiting for the GPU, the 5-minute stability run, memcheck of the kernels,
  # then 64 streams over 8 processes if time is left.
  timeout 70 python3 bench/gpu/wait_probe.py --out "$OUT/wait_probe.json" \
    >"$OUT/wait_probe.log" 2>&1
  echo "wait probe rc=$? ($((SECONDS - started)) s)"
  tail -n 12 "$OUT/wait_probe.log"
  stability_run 360 55
  if (( SECONDS - started < 430 )); then
    timeout 35 compute-sanitizer --tool memcheck python3 bench/gpu/sanitize_check.py \
      >"$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$? ($((SECONDS - started)) s)"
    tail -n 3 "$OUT/memcheck.log"
  fi
  if (( SECONDS - started < 400 )); then
    stream_runs $((480 - (SECONDS - started))) "${VDET_RUNS:-vdet:64:p:x8}" 6
  fi
  ;;
*)
  echo "unknown phase $phase" >&2
  exit 2
  ;;
esac
