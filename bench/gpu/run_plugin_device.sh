#!/usr/bin/env bash
# vdet's TensorRT plugin (VdetDecodeNms) on a real GPU, without TensorRT, in one run on an offline
# GPU machine (nvcc + g++ + python3 with numpy; no cmake, no TensorRT, no network):
#   1. for every TensorRT header version carried in .trt-include/<tag>/include (written by
#      bench/gpu/fetch_trt_headers.sh), build libvdet_plugins.so the way plugins/CMakeLists.txt
#      does (hidden visibility, shared CUDA runtime, no libnvinfer) for sm_90, and
#      plugins/tests/plugin_harness.cpp linked against it;
#   2. plugins/tests/plugin_harness_check.py: each harness's self-checks (creator, fields,
#      getOutputDataTypes, getOutputShapes with a dynamic batch, supportsFormatCombination,
#      getWorkspaceSize, configurePlugin, onShapeChange, getFieldsToSerialize -> createPlugin,
#      enqueue on a hand-computed head), then enqueue on device buffers for 10 raw heads
#      (up to [4, 84, 8400], float32 and float16, every anchor above the threshold, top_k 4096)
#      against the CPU reference decode_and_nms_image; enqueue timed with CUDA events on the
#      dense [1, 84, 8400] head;
#   3. if compute-sanitizer exists: memcheck on the self-checks and on the dense [1, 84, 8400]
#      head.
# Writes $OUT/plugin_harness.json and $OUT/plugin_harness.log (OUT defaults to /tmp/vdet-out),
# prints a short summary, and exits non-zero on a build failure, a mismatch or a memcheck error.
#   first: bash bench/gpu/fetch_trt_headers.sh          (v10.8.0 and v11.1 into .trt-include/)
#   run:   bash bench/gpu/run_plugin_device.sh          (with .trt-include/ copied along)
# Settings: VDET_CUDA_ARCH (90), CUDA_HOME (/usr/local/cuda), VDET_TRT_INCLUDE (.trt-include),
# VDET_PLUGIN_BUILD (/tmp/vdet-plugin-build), VDET_TIME_ITERS (200).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/vdet-out}
mkdir -p "$OUT"
LOG=$OUT/plugin_harness.log
JSON=$OUT/plugin_harness.json
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
ARCH=${VDET_CUDA_ARCH:-90}
TRT_DIR=${VDET_TRT_INCLUDE:-.trt-include}
BUILD=${VDET_PLUGIN_BUILD:-/tmp/vdet-plugin-build}
WORK=$BUILD/work
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
started=$SECONDS
: >"$LOG"
rm -f "$JSON"

log() { echo "$*" >>"$LOG"; }
# Runs a command with its line and output in the log.
step() {
  log "+ $*"
  "$@" >>"$LOG" 2>&1
}
# A build or setup failure: a JSON that says so, the end of the log, exit 1.
fail() {
  log "FAILED: $*"
  python3 - "$JSON" "$*" "$LOG" <<'EOF'
import json, sys
path, reason, log = sys.argv[1:]
tail = open(log, encoding="utf-8", errors="replace").read().splitlines()[-40:]
json.dump({"ok": False, "failed": reason, "log_tail": tail}, open(path, "w"), indent=2)
EOF
  tail -n 30 "$LOG"
  echo "run_plugin_device: FAILED: $*"
  exit 1
}

# ---- environment ----------------------------------------------------------------------------
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  "$NVCC" --version | tail -n 2
  g++ --version | head -n 1
  python3 -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
} >"$OUT/env_plugin.txt" 2>&1
cat "$OUT/env_plugin.txt" >>"$LOG"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
nvcc_version=$("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -n 1)

roots=()
for dir in "$TRT_DIR"/*/; do
  [[ -f ${dir}include/NvInferRuntime.h ]] && roots+=("${dir%/}")
done
((${#roots[@]} > 0)) || fail "no TensorRT headers in $TRT_DIR/<tag>/include: run bash bench/gpu/fetch_trt_headers.sh where a TensorRT mirror is and copy .trt-include here"
log "TensorRT headers: ${roots[*]}"

# ---- 1. build ---------------------------------------------------------------------------------
# As plugins/CMakeLists.txt: -Wall -Wextra (here also -Werror), TensorRT's headers as system
# headers, hidden visibility (getCreators and setLoggerFinder are the only exports), the shared
# CUDA runtime (one runtime per process, the one TensorRT uses too), no libnvinfer. The kernel
# sources are included as "kernels/..." from the package (service/vdet/cuda/kernels/).
rm -rf "$BUILD"
mkdir -p "$BUILD" "$WORK"
cxx=(g++ -std=c++17 -O2 -g -fPIC -Wall -Wextra -Werror -Iplugins -Iservice/vdet/cuda -isystem "$CUDA_HOME/include")
hidden=(-fvisibility=hidden -fvisibility-inlines-hidden)
cudalib=(-L"$CUDA_HOME/lib64" -lcudart -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64")
step "$NVCC" -std=c++17 -O3 -lineinfo -gencode "arch=compute_$ARCH,code=sm_$ARCH" \
  -Xcompiler -fPIC,-fvisibility=hidden -Iplugins -Iservice/vdet/cuda -c plugins/decode_nms_kernels.cu \
  -o "$BUILD/decode_nms_kernels.o" || fail "nvcc plugins/decode_nms_kernels.cu"
step "${cxx[@]}" "${hidden[@]}" -c plugins/decode_nms_launch.cpp -o "$BUILD/decode_nms_launch.o" ||
  fail "g++ plugins/decode_nms_launch.cpp"
harnesses=()
notes=(--note "gpu=$gpu" --note "nvcc=$nvcc_version" --note "arch=sm_$ARCH")
for root in "${roots[@]}"; do
  tag=$(basename "$root")
  dir=$BUILD/$tag
  mkdir -p "$dir"
  step "${cxx[@]}" "${hidden[@]}" -isystem "$root/include" -c plugins/vdet_plugin.cpp \
    -o "$dir/vdet_plugin.o" || fail "g++ plugins/vdet_plugin.cpp against $tag"
  step g++ -shared -o "$dir/libvdet_plugins.so" "$dir/vdet_plugin.o" "$BUILD/decode_nms_launch.o" \
    "$BUILD/decode_nms_kernels.o" "${cudalib[@]}" || fail "linking libvdet_plugins.so ($tag)"
  step "${cxx[@]}" -isystem "$root/include" -c plugins/tests/plugin_harness.cpp \
    -o "$dir/plugin_harness.o" || fail "g++ plugins/tests/plugin_harness.cpp against $tag"
  step g++ -o "$dir/vdet_plugin_harness" "$dir/plugin_harness.o" -L"$dir" -lvdet_plugins \
    -Xlinker -rpath -Xlinker "$dir" "${cudalib[@]}" || fail "linking the harness ($tag)"
  exports=$(nm -D --defined-only "$dir/libvdet_plugins.so" | awk '$2 ~ /^[TDBVW]$/ {print $3}' |
    grep -v '^_' | sort | paste -sd, -)
  log "$tag: libvdet_plugins.so exports: $exports"
  if ldd "$dir/libvdet_plugins.so" "$dir/vdet_plugin_harness" | grep -q nvinfer; then
    fail "$tag: something links libnvinfer"
  fi
  [[ ,$exports, == *,getCreators,* ]] || fail "$tag: libvdet_plugins.so does not export getCreators"
  notes+=(--note "exports_$tag=$exports")
  harnesses+=(--harness "$tag=$dir/vdet_plugin_harness")
done
log "built in $((SECONDS - started)) s"
if [[ ${VDET_BUILD_ONLY:-0} == 1 ]]; then
  echo "run_plugin_device: built ${harnesses[*]} (VDET_BUILD_ONLY=1: not run)"
  exit 0
fi

# ---- 2. checks against the CPU reference ---------------------------------------------------------
# vdet (NumPy reference only) from this checkout: service/ holds the package.
PYTHONPATH=service timeout 90 python3 plugins/tests/plugin_harness_check.py "${harnesses[@]}" \
  --work "$WORK" \
  --json "$JSON" --time-case dense_b1 --time-iters "${VDET_TIME_ITERS:-200}" "${notes[@]}" \
  >"$OUT/plugin_check.log" 2>&1
check_rc=$?
cat "$OUT/plugin_check.log" >>"$LOG"
[[ -f $JSON ]] || fail "plugin_harness_check.py wrote no report (exit $check_rc)"

# ---- 3. compute-sanitizer memcheck (when present) ----------------------------------------------
sanitizer_rc=0
sanitizer=$CUDA_HOME/bin/compute-sanitizer
command -v "$sanitizer" >/dev/null || sanitizer=$(command -v compute-sanitizer || true)
first=${harnesses[1]#*=}
# The dense [1, 84, 8400] case's command line, as the checker ran it (without timing).
dense=()
read -r -a dense < <(python3 -c "import json, sys; r = json.load(open(sys.argv[1])); \
h = next(iter(r['harnesses'].values())); \
print(next(c['command'] for c in h['cases'] if c['case']['name'] == 'dense_b1'))" "$JSON" \
  2>/dev/null)
if [[ -n $sanitizer && -x $sanitizer && ${#dense[@]} -gt 0 ]] && ((SECONDS - started < 75)); then
  {
    echo "== memcheck: self-checks"
    timeout 25 "$sanitizer" --tool memcheck --error-exitcode 3 "$first" 2>&1 | tail -n 4
    echo "rc ${PIPESTATUS[0]}"
    echo "== memcheck: dense_b1"
    timeout 25 "$sanitizer" --tool memcheck --error-exitcode 3 "${dense[@]}" 2>&1 | tail -n 4
    echo "rc ${PIPESTATUS[0]}"
  } >"$OUT/plugin_sanitizer.log" 2>&1
  cat "$OUT/plugin_sanitizer.log" >>"$LOG"
  grep -q '^rc 3$' "$OUT/plugin_sanitizer.log" && sanitizer_rc=3
else
  echo "skipped: no compute-sanitizer ('${sanitizer}'), no dense_b1 case, or $((SECONDS - started)) s used" \
    >"$OUT/plugin_sanitizer.log"
fi
python3 - "$JSON" "$OUT/plugin_sanitizer.log" "$sanitizer_rc" <<'EOF'
import json, sys
path, log, rc = sys.argv[1:]
report = json.load(open(path))
report["memcheck"] = {"errors": rc == "3", "log": open(log).read().splitlines()[-12:]}
report["ok"] = bool(report["ok"]) and rc != "3"
json.dump(report, open(path, "w"), indent=2)
EOF

# ---- summary ---------------------------------------------------------------------------------
echo "== $gpu, $nvcc_version, sm_$ARCH; headers: ${roots[*]}"
grep -E '^\[|^plugin harness check|^note' "$OUT/plugin_check.log"
echo "== memcheck"
grep -E '^==|ERROR SUMMARY|^rc|skipped' "$OUT/plugin_sanitizer.log"
echo "checks rc=$check_rc memcheck rc=$sanitizer_rc, $((SECONDS - started)) s; $JSON"
exit $((check_rc != 0 || sanitizer_rc != 0))
