#!/usr/bin/env bash
# The GPU-side checks and benchmarks of vdet, as a few scenarios that each fit one ten-minute run
# on an offline GPU machine:
#   tests     install + pytest -m gpu tests (every test marked gpu, in every folder: kernels,
#             NVDEC, torch backend, GPU devices, worker processes, vdet bench serve),
#             then the TensorRT plugin harness (bench/gpu/run_plugin_device.sh, when
#             .trt-include is there)
#   pipeline  the kernel micro-benchmarks, then the frame -> detections pipeline bench
#             (bench/gpu/pipeline.py; $VDET_PIPELINE_SECTIONS, default: demo model and YOLOv8s
#             sections)
#   streams   bench/gpu/streams.py: paced/unpaced many-stream runs and their peers, or only the
#             runs named in $VDET_RUNS (e.g. "vdet:64:p:x8:mps decode_only:64:u:x8")
#   stability one long 32-stream run sampling RSS and GPU memory, then compute-sanitizer
#             (memcheck, racecheck) on the kernels in what is left
#   rect      rectangular inputs: their GPU tests, square vs rect pipeline, unpaced 64 streams
#             square vs rect vs the decode-only ceiling
#   serve     the worker-process GPU tests, then vdet bench serve (worker processes; one
#             worker killed mid-window at 64 streams)
#   media     bench/gpu/media_matrix.py: the media robustness matrix through vdet serve,
#             gpu.decoder auto (NVDEC) beside gpu.decoder cpu (after the GPU tests named in
#             $VDET_MEDIA_TESTS, if any)
#   tenbit    vdet bench serve, paced, on the sample clip as 8-bit and as 10-bit HEVC (IPPP):
#             streams per GPU with NVDEC's NV12 vs P016 surfaces, same server, same counts
#   ceiling   vdet bench serve --find-ceiling from $VDET_CEILING_MIN (112) by 16 to
#             $VDET_CEILING_MAX (192) paced streams, 4 clients, worker processes, beside the
#             decode-only ceiling of the same call, in $VDET_CEILING_BUDGET_S (570) seconds
#   camera    only unpacks .rtsp-camera.tar.xz (bench/gpu/pack_rtsp_camera.sh: the RTSP test
#             camera with its Python and GStreamer) to /tmp/rtsp-camera and checks it starts;
#             the tests and media phases of later calls on the same machine use it
#             ($RTSP_CAMERA_PYTHON) for their RTSP cases
# The wheels the GPU image lacks, in .whl/: `bash bench/gpu/gather_wheels.sh` (its list: av,
# PyNvVideoCodec slimmed, the API's, vdet.config's, MQTT and NATS clients, ...; more named on
# its command line, e.g. py-spy for VDET_SERVE_PROFILE_S or ultralytics for the peer runs of
# `streams` and `pipeline`), recompressed with LZMA to travel in less space.
# JSON and logs are written under /tmp/vdet-out; when the caller sets $OUT (a folder copied back
# from the GPU machine, best kept to a few files), they are packed there as ONE tarball,
# $OUT/results-<phase>.tgz. The last lines printed are a short summary.
#   run: bash bench/gpu/run_session_device.sh tests|pipeline|streams|stability|rect|serve|media|
#        tenbit|ceiling|camera
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
phase=${1:?tests, pipeline, streams, stability, rect, serve, media, tenbit, ceiling or camera}
DEST=${OUT:-}
OUT=/tmp/vdet-out
mkdir -p "$OUT"
pack() { [ -n "$DEST" ] && tar czf "$DEST/results-$phase.tgz" -C "$OUT" . ; }
trap pack EXIT
trap 'exit 143' TERM  # stopped from outside: still pack what is there
camera=/tmp/rtsp-camera/rtsp-camera/python3
if [ "$phase" = camera ]; then
  rm -rf /tmp/rtsp-camera && mkdir -p /tmp/rtsp-camera &&
    tar -xJf .rtsp-camera.tar.xz -C /tmp/rtsp-camera || exit 1
  "$camera" -c "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0')
from gi.repository import Gst, GstRtspServer; Gst.init(None)
print('rtsp camera:', Gst.version_string(), [e for e in ('qtdemux', 'h264parse', 'rtph264pay',
      'appsrc', 'rtpbin') if not Gst.ElementFactory.find(e)] or 'all elements found')"
  exit $?
fi
[ -x "$camera" ] && export RTSP_CAMERA_PYTHON=$camera
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 XDG_CACHE_HOME=/tmp/vdet-cache
SITE=/tmp/site
started=$SECONDS
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade \
    --target "$SITE" .
} >"$OUT/install-$phase.log" 2>&1 || { echo "install failed"; tail -n 20 "$OUT/install-$phase.log"; }
export PYTHONPATH=$SITE

# install_venv: vdet as users install it (its `vdet` console script included: the serve tests
# and `vdet bench serve` start the real server) in /tmp/venv over the image's torch, first on
# PATH.
install_venv() {
  unset PYTHONPATH  # else the venv's pip takes /tmp/site's wheels as already installed
  python3 -m venv /tmp/venv  # the image's own packages (torch, numpy, ...) through a .pth
  python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth"
  /tmp/venv/bin/python -m pip install -q --no-index --no-deps --no-compile .whl/*.whl \
    >>"$OUT/install-$phase.log" 2>&1
  /tmp/venv/bin/python -m pip install -q --no-deps --no-build-isolation --no-compile -e . \
    >>"$OUT/install-$phase.log" 2>&1
  export PATH="/tmp/venv/bin:$PATH"
}

# profile_servers SECONDS: beside `vdet bench serve`, for each `vdet serve` it starts (3 at
# most): once the GPU reports work (the streams run), py-spy samples the server and its worker
# processes for SECONDS into $OUT/pyspy-<i>.txt (collapsed stacks, one line per stack and
# thread, with its process). Needs py-spy among the wheels; without it, does nothing.
profile_servers() {
  command -v py-spy >/dev/null || { echo "no py-spy: no profile"; return; }
  local seen="" pid i util
  for i in 1 2 3; do
    pid=""
    for _ in $(seq 1 300); do
      pid=$(pgrep -f "serve --config" | grep -vxF -e "${seen:-x}" | head -n 1)
      [ -n "$pid" ] && break
      sleep 1
    done
    [ -z "$pid" ] && return
    seen+="${seen:+$'\n'}$pid"
    for _ in $(seq 1 240); do
      util=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -n 1)
      [ "${util:-0}" -ge 30 ] && break
      sleep 0.5
    done
    sleep 4
    timeout $(($1 + 20)) py-spy record --pid "$pid" --subprocesses --duration "$1" --rate 67 \
      --nonblocking --format raw --output "$OUT/pyspy-$i.txt" >"$OUT/pyspy-$i.log" 2>&1
  done
}

# gpu_tests SECONDS: pytest -m gpu on $VDET_GPU_TESTS (test files or folders, in the order
# given), its summary printed. Default: every test file of the tree that marks tests `gpu`
# (directly, or through the kernel tests' `harness` fixture): collecting the whole tree would
# import the CPU tests' tools (schemathesis, playwright, ...), which this machine lacks.
gpu_tests() {
  local paths=${VDET_GPU_TESTS:-$(grep -rlE 'mark\.gpu|\bharness\b' tests --include='test_*.py' | sort)}
  unset VDET_GPU_TESTS  # vdet refuses VDET_ variables it does not know
  # shellcheck disable=SC2086  # a list of paths
  timeout "$1" python3 -m pytest -m gpu $paths -q -rs -p no:cacheprovider \
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
media)
  # $VDET_MEDIA_TESTS: GPU test files to run first (the decoder's own tests), same install.
  # $VDET_MEDIA_BUDGET_S: the seconds the phase may take (default 570).
  # $VDET_MEDIA_ARGS: more arguments for media_matrix.py (e.g. --only rtsp). The tests take at
  # most half the budget.
  budget=${VDET_MEDIA_BUDGET_S:-570} extra=${VDET_MEDIA_ARGS:-}
  unset VDET_MEDIA_BUDGET_S VDET_MEDIA_ARGS
  install_venv  # the matrix runs the installed `vdet serve`
  if [ -n "${VDET_MEDIA_TESTS:-}" ]; then
    VDET_GPU_TESTS=$VDET_MEDIA_TESTS gpu_tests $((budget / 2))
  fi
  unset VDET_MEDIA_TESTS
  # shellcheck disable=SC2086  # $extra: words
  timeout $((budget - (SECONDS - started))) python3 bench/gpu/media_matrix.py \
    --out "$OUT/media.json" --frames 150 --timeout 200 $extra >"$OUT/media.log" 2>&1
  echo "media rc=$? ($((SECONDS - started)) s)"
  tail -n 25 "$OUT/media.log"
  ;;
ceiling)
  low=${VDET_CEILING_MIN:-112} high=${VDET_CEILING_MAX:-192} budget=${VDET_CEILING_BUDGET_S:-570}
  unset VDET_CEILING_MIN VDET_CEILING_MAX VDET_CEILING_BUDGET_S
  install_venv
  timeout $((budget - (SECONDS - started))) /tmp/venv/bin/vdet bench serve --backend torch \
    --find-ceiling \
    --min-streams "$low" --max-streams "$high" --clients 4 \
    --variant "workers:workers.processes=auto" \
    --output "$OUT/ceiling.json" >"$OUT/ceiling.log" 2>&1
  echo "bench serve --find-ceiling rc=$? ($((SECONDS - started)) s)"
  tail -n 14 "$OUT/ceiling.log"
  ;;
tenbit)
  # $VDET_TENBIT_STREAMS: the stream counts (default 64,112), each step 10 s, 2 clients.
  # $VDET_TENBIT_BUDGET_S: the seconds the phase may take (default 570).
  counts=${VDET_TENBIT_STREAMS:-64,112} budget=${VDET_TENBIT_BUDGET_S:-570}
  unset VDET_TENBIT_STREAMS VDET_TENBIT_BUDGET_S
  install_venv
  for depth in 8 10; do
    fmt=yuv420p; [ "$depth" = 10 ] && fmt=yuv420p10le
    /tmp/venv/bin/python -c "
import sys
from pathlib import Path
from vdet.core.assets import sample_clip
from vdet.modelkit.dataset.media_cases import reencode
reencode(sample_clip(), Path(sys.argv[1]), 'libx265', sys.argv[2],
         options={'preset': 'fast', 'x265-params': 'log-level=error:bframes=0'})
" "/tmp/hevc$depth.mp4" "$fmt" >>"$OUT/tenbit.log" 2>&1
    echo "encoded hevc$depth ($((SECONDS - started)) s)"
  done
  for depth in 8 10; do
    # Half of what is left of the budget to the 8-bit run, the rest to the 10-bit one.
    left=$((budget - (SECONDS - started)))
    [ "$depth" = 8 ] && left=$((left / 2))
    timeout "$left" /tmp/venv/bin/vdet bench serve --backend torch \
      --clip "/tmp/hevc$depth.mp4" --streams "$counts" --duration 10 --clients 2 \
      --variant "hevc$depth:workers.processes=auto" \
      --output "$OUT/serve-hevc$depth.json" >"$OUT/serve-hevc$depth.log" 2>&1
    echo "bench serve hevc$depth rc=$? ($((SECONDS - started)) s)"
    tail -n 12 "$OUT/serve-hevc$depth.log"
  done
  ;;
tests)
  install_venv  # the serve tests start `vdet serve`
  export NVDEC_CAPS_OUT=$OUT/nvdec_caps.json  # the decoder caps, as the driver answers them
  gpu_tests 480
  if [ -d .trt-include ]; then
    timeout 90 bash bench/gpu/run_plugin_device.sh >"$OUT/plugin_run.log" 2>&1
    echo "plugin harness rc=$? ($((SECONDS - started)) s)"
    tail -n 12 "$OUT/plugin_run.log"
  fi
  ;;
pipeline)
  timeout 90 python3 bench/gpu/kernels.py --out "$OUT/kernels.json" >"$OUT/kernels.log" 2>&1
  echo "kernels rc=$? ($((SECONDS - started)) s)"
  tail -n 16 "$OUT/kernels.log"
  sections=${VDET_PIPELINE_SECTIONS:-graph,graph_cuda,eager_cuda,ultralytics,memory,nvdec}
  unset VDET_PIPELINE_SECTIONS
  timeout $((570 - (SECONDS - started))) python3 bench/gpu/pipeline.py --sections "$sections" \
    --out "$OUT/gpu_pipeline.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  tail -n 16 "$OUT/pipeline.log"
  ;;
streams)
  if [ -n "${VDET_RUNS:-}" ]; then
    runs=$VDET_RUNS
    unset VDET_RUNS
    stream_runs 570 "$runs" 24
  else
    timeout 570 python3 bench/gpu/streams.py --out "$OUT/streams.json" --seconds 10 \
      >"$OUT/streams.log" 2>&1
    echo "streams rc=$? ($((SECONDS - started)) s)"
    tail -n 30 "$OUT/streams.log"
  fi
  ;;
stability)
  # The long run first (it needs its whole duration), then compute-sanitizer on the kernels.
  stability_run 380 60
  for tool in memcheck racecheck; do
    if (( SECONDS - started < 560 )); then
      timeout 30 compute-sanitizer --tool "$tool" python3 bench/gpu/sanitize_check.py 2>&1 \
        | tail -n 3
    fi
  done
  ;;
rect)
  # Rectangular inputs (docs/gpu-data-path.md, "Input shapes"): the kernels at 384x640 and
  # 480x640 with the existing kernel and runner tests, the frame -> detections p50 square vs
  # rect (target: YOLOv8s <= 1.0 ms at rect), then unpaced 64 streams rect vs square vs the
  # decode-only ceiling (target: rect >= 90% of it), each run 8 s.
  timeout 200 python3 -m pytest -m gpu tests/cuda tests/inference/test_inference_torch_backend_gpu.py \
    tests/gpu/test_gpu_input_shapes_gpu.py tests/gpu/test_gpu_devices_gpu.py -q -rs \
    -p no:cacheprovider --junitxml="$OUT/junit.xml" >"$OUT/pytest.log" 2>&1
  echo "pytest rc=$? ($((SECONDS - started)) s)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -n 12
  timeout 130 python3 bench/gpu/pipeline.py --sections graph_cuda,graph_cuda_rect \
    --section-timeout 60 --out "$OUT/gpu_pipeline_rect.json" >"$OUT/pipeline.log" 2>&1
  echo "pipeline rc=$? ($((SECONDS - started)) s)"
  grep -E "graph_cuda|rect / square" "$OUT/pipeline.log"
  stream_runs $((590 - (SECONDS - started))) "${VDET_RUNS:-decode_only:64:u:x8 \
vdet:64:u:1:x8:mps:rect vdet:64:u:1:x8:mps:square}" 8
  ;;
serve)
  # vdet serve as users run it, installed in a venv over the image's torch: the GPU
  # worker-process tests (kill -9 and the restart, SIGTERM), then `vdet bench serve` with worker
  # processes at $VDET_SERVE_STREAMS, in what is left of $VDET_SERVE_BUDGET seconds. In the steps of $VDET_SERVE_KILL_STREAMS (default 64;
  # those not in $VDET_SERVE_STREAMS are left out) one worker is killed with SIGKILL
  # $VDET_SERVE_KILL_AFTER seconds (default 3) into the window; either one empty: no kill.
  # $VDET_SERVE_VARIANTS: the server configurations, ';'-separated `vdet bench serve --variant`
  # texts (default: worker processes, `auto`); $VDET_WORKERS_TESTS_S=0 skips the tests.
  # $VDET_SERVE_PROFILE_S=N: py-spy samples each server's processes for N s once its streams
  # run (profile_servers; py-spy's wheel in .whl/).
  # $VDET_SERVE_UNPACED=1: the streams are added unpaced (`--unpaced`: each analyses the clip
  # as fast as the server detects), after the decode-only ceiling at the first stream count
  # (bench/gpu/streams.py, NVDEC alone over 8 processes) in the same call.
  # This script's knobs are read here and dropped: vdet serve refuses unknown VDET_ variables.
  budget=${VDET_SERVE_BUDGET:-500} tests_s=${VDET_WORKERS_TESTS_S:-200}
  variants=${VDET_SERVE_VARIANTS:-workers:workers.processes=auto}
  streams=${VDET_SERVE_STREAMS:-64,96}
  kill_after=${VDET_SERVE_KILL_AFTER-3} kill_streams=${VDET_SERVE_KILL_STREAMS-64}
  unpaced=${VDET_SERVE_UNPACED:-0} profile=${VDET_SERVE_PROFILE_S:-0}
  unset VDET_SERVE_BUDGET VDET_WORKERS_TESTS_S VDET_SERVE_STREAMS VDET_SERVE_PROFILE_S \
    VDET_SERVE_KILL_AFTER VDET_SERVE_KILL_STREAMS VDET_SERVE_VARIANTS VDET_SERVE_UNPACED
  variant_args=()
  IFS=';' read -ra variant_list <<<"$variants"
  for v in "${variant_list[@]}"; do variant_args+=(--variant "$v"); done
  kill_in=""
  for n in ${kill_streams//,/ }; do
    [[ ",$streams," == *",$n,"* ]] && kill_in+="${kill_in:+,}$n"
  done
  kill_args=()
  [ -n "$kill_after" ] && [ -n "$kill_in" ] &&
    kill_args=(--kill-worker-after "$kill_after" --kill-worker-streams "$kill_in")
  install_venv
  if [ "$tests_s" -gt 0 ]; then
    timeout "$tests_s" /tmp/venv/bin/python -m pytest -m gpu \
      tests/workers/test_workers_serve_gpu.py -q -s -rs -p no:cacheprovider >"$OUT/workers.log" 2>&1
    echo "workers rc=$? ($((SECONDS - started)) s)"
    cp /tmp/pytest-of-*/pytest-*/gpu_devices*/vdet-*.log "$OUT/" 2>/dev/null
    grep -E "mps=|published again|stopped in|passed|failed|Error|assert" "$OUT/workers.log" |
      tail -n 12
  fi
  pace_args=()
  if [ "$unpaced" = 1 ]; then
    stream_runs 90 "decode_only:${streams%%,*}:u:x8" 3
    pace_args=(--unpaced)
  fi
  profiler=""
  if [ "$profile" -gt 0 ]; then profile_servers "$profile" & profiler=$!; fi
  timeout $((budget - (SECONDS - started))) /tmp/venv/bin/vdet bench serve --backend torch \
    --streams "$streams" --duration 10 --clients 4 "${pace_args[@]}" \
    "${variant_args[@]}" \
    "${kill_args[@]}" --output "$OUT/serve.json" >"$OUT/serve.log" 2>&1
  echo "bench serve rc=$? ($((SECONDS - started)) s)"
  [ -n "$profiler" ] && { kill "$profiler" 2>/dev/null; wait "$profiler" 2>/dev/null; }
  tail -n 25 "$OUT/serve.log"
  ;;
*)
  echo "unknown phase $phase" >&2
  exit 2
  ;;
esac
