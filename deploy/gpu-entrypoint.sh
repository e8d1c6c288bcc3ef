#!/bin/sh
# Entrypoint of the GPU image (deploy/Dockerfile.gpu): `vdet serve` on the GPU data path when a
# GPU is visible, and a log line that says what to expect and why.
#
#   1. Anything but `serve` (`vdet detect ...`, `vdet engine build ...`) runs as given.
#   2. VDET_BACKEND set to something other than auto: serve on it, decide nothing.
#   3. No NVIDIA GPU in the container: ONNX Runtime on the CPU (the image still works there).
#   4. A GPU, but CUDA cannot use it (typically a driver older than R580 for CUDA 13): refuse
#      to serve on the CPU of a GPU node, with the reason; ALLOW_CPU_FALLBACK=1 serves on ONNX
#      Runtime anyway.
#   5. Otherwise `backend: auto` decides in vdet: TensorRT where an engine builds and runs on
#      this GPU (TensorRT for RTX on compute capability 8.0, 8.6, 8.9, 12.x; full TensorRT if
#      the image has it), else torch CUDA graphs. /readyz and the vdet_backend metric say which
#      serves and why. Warnings here: no NVDEC capability, an engine cache it cannot write.
set -eu

ENGINE_DIR="${VDET_ENGINE__CACHE_DIR:-/var/lib/vdet/engines}"
NVIDIA_DEVICE_DIR="${NVIDIA_DEVICE_DIR:-/dev}"

log() {
    printf '%s vdet-entrypoint: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

gpu_visible() {
    for device in "$NVIDIA_DEVICE_DIR"/nvidia[0-9]*; do
        [ -e "$device" ] && return 0
    done
    return 1
}

if [ "$#" -eq 0 ]; then
    set -- serve
fi
if [ "$1" != serve ]; then
    exec vdet "$@"
fi

case "${VDET_BACKEND:-auto}" in
    auto) ;;
    *)
        log "VDET_BACKEND=$VDET_BACKEND is set; serving on it"
        exec vdet "$@"
        ;;
esac

if ! gpu_visible; then
    log "no NVIDIA GPU in this container (no $NVIDIA_DEVICE_DIR/nvidia<N>; run with --gpus or the compose gpu profile); serving with the onnxruntime backend on the CPU"
    VDET_BACKEND=onnxruntime
    export VDET_BACKEND
    exec vdet "$@"
fi

if ! why=$(python -c 'import sys, torch; ok = torch.cuda.is_available(); print("" if ok else "torch %s (CUDA %s) sees no usable GPU" % (torch.__version__, torch.version.cuda)); sys.exit(0 if ok else 3)' 2>&1); then
    why=$(printf '%s\n' "$why" | tail -n 1)
    if [ "${ALLOW_CPU_FALLBACK:-0}" = 1 ]; then
        log "a GPU is visible but CUDA cannot use it (${why:-no output}); ALLOW_CPU_FALLBACK=1: serving with the onnxruntime backend on the CPU"
        VDET_BACKEND=onnxruntime
        export VDET_BACKEND
        exec vdet "$@"
    fi
    log "a GPU is visible but CUDA cannot use it (${why:-no output}); this image needs NVIDIA driver R580 or newer (CUDA 13). Refusing to serve on the CPU of a GPU node; set ALLOW_CPU_FALLBACK=1 to do it anyway"
    exit 1
fi

case ",${NVIDIA_DRIVER_CAPABILITIES:-}," in
    *,all,* | *,video,*) ;;
    *) log "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-} lacks 'video': NVDEC is not mounted, frames decode on the CPU" ;;
esac
if ! mkdir -p "$ENGINE_DIR" 2>/dev/null || [ ! -w "$ENGINE_DIR" ]; then
    log "the engine cache $ENGINE_DIR is not writable by uid $(id -u): no TensorRT engine can be built; torch CUDA graphs will serve"
fi
log "GPU visible: backend auto (a TensorRT engine where one builds and runs on this GPU, else torch CUDA graphs); /readyz says which serves and why"
exec vdet "$@"
