#!/usr/bin/env bash
# Export TensorRT's public headers (include/*.h of github.com/NVIDIA/TensorRT) at one or more tags
# from a local git mirror into .trt-include/<tag>/include/, the folder that
# bench/gpu/run_plugin_device.sh and plugins/CMakeLists.txt (-DTensorRT_ROOT=.trt-include/<tag>)
# read. .trt-include/ is ignored by git: NVIDIA's headers are never committed, nor anything built
# from them.
#
#   git clone --bare https://github.com/NVIDIA/TensorRT.git /path/to/TensorRT.git   # once
#   VDET_TRT_MIRROR=/path/to/TensorRT.git bash bench/gpu/fetch_trt_headers.sh          # v10.8.0, v11.1
#   VDET_TRT_MIRROR=/path/to/TensorRT.git bash bench/gpu/fetch_trt_headers.sh v10.16   # any tag
#
# The mirror is a bare or ordinary clone (git --git-dir=... tag lists the tags); this script
# downloads nothing. About 0.8 MiB per tag.
set -euo pipefail
cd "$(dirname "$0")/../.."
MIRROR=${VDET_TRT_MIRROR:?set VDET_TRT_MIRROR to a clone of github.com/NVIDIA/TensorRT}
DEST=${VDET_TRT_INCLUDE:-.trt-include}
if [[ $# -eq 0 ]]; then
  set -- v10.8.0 v11.1
fi
if ! git --git-dir="$MIRROR" rev-parse --git-dir >/dev/null 2>&1; then
  echo "fetch_trt_headers: $MIRROR is not a git repository (set VDET_TRT_MIRROR)" >&2
  exit 2
fi
for tag in "$@"; do
  if ! git --git-dir="$MIRROR" rev-parse --verify --quiet "$tag^{commit}" >/dev/null; then
    echo "fetch_trt_headers: no tag $tag in $MIRROR; it has: $(git --git-dir="$MIRROR" tag | sort -V | tr '\n' ' ')" >&2
    exit 2
  fi
  rm -rf "${DEST:?}/$tag"
  mkdir -p "$DEST/$tag"
  git --git-dir="$MIRROR" archive --format=tar "$tag" include | tar -x -C "$DEST/$tag"
  header=$DEST/$tag/include/NvInferVersion.h
  [[ -f $DEST/$tag/include/NvInferRuntime.h && -f $header ]] || {
    echo "fetch_trt_headers: $tag has no include/NvInferRuntime.h" >&2
    exit 1
  }
  version=$(grep -E '#define (TRT|NV_TENSORRT)_(MAJOR|MINOR|PATCH)(_ENTERPRISE)? +[0-9]+' "$header" |
    awk '{print $3}' | paste -sd. -)
  echo "$DEST/$tag/include: TensorRT $version headers, $(du -sk "$DEST/$tag" | cut -f1) KiB"
done
