#!/bin/sh
# Entrypoint of the GPU image (deploy/Dockerfile.gpu): `vdet serve` on TensorRT when it can be,
# on ONNX Runtime when it cannot, and a log line that says which and why.
#
#   1. Anything but `serve` (`vdet detect ...`, `vdet eval ...`) runs as given.
#   2. VDET_BACKEND set to something other than tensorrt/auto: serve on it, build nothing.
#   3. `vdet engine build --cache-dir "$ENGINE_DIR"` builds the TensorRT engine for the
#      configured model into the cache volume, or reuses the one already there; then serve
#      with VDET_BACKEND=tensorrt.
#   4. When `vdet engine` does not exist in this vdet, the cache is not writable or the build
#      fails: serve with VDET_BACKEND=onnxruntime.
set -eu

ENGINE_DIR="${ENGINE_DIR:-/var/lib/vdet/engines}"

log() {
    printf '%s vdet-entrypoint: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

serve_on() {
    backend=$1
    shift
    VDET_BACKEND=$backend
    export VDET_BACKEND
    exec vdet "$@"
}

fall_back() {
    reason=$1
    shift
    log "$reason; serving with the onnxruntime backend"
    serve_on onnxruntime "$@"
}

if [ "$#" -eq 0 ]; then
    set -- serve
fi
if [ "$1" != serve ]; then
    exec vdet "$@"
fi

case "${VDET_BACKEND:-auto}" in
    auto | tensorrt) ;;
    *)
        log "VDET_BACKEND=$VDET_BACKEND is set; not building a TensorRT engine"
        exec vdet "$@"
        ;;
esac

if ! help=$(vdet engine --help 2>&1); then
    why=$(printf '%s\n' "$help" | tail -n 1)
    fall_back "'vdet engine' is not available in this vdet (${why:-no output})" "$@"
fi
if ! mkdir -p "$ENGINE_DIR" 2>/dev/null || [ ! -w "$ENGINE_DIR" ]; then
    fall_back "the engine cache $ENGINE_DIR is not writable by uid $(id -u)" "$@"
fi
log "building the TensorRT engine into $ENGINE_DIR (reused when already built)"
if ! vdet engine build --cache-dir "$ENGINE_DIR"; then
    fall_back "'vdet engine build' failed (its output is above)" "$@"
fi
log "TensorRT engine ready; serving with the tensorrt backend"
serve_on tensorrt "$@"
