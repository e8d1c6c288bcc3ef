/* Host-side launch of the decode + NMS kernels (service/vdet/cuda/kernels/decode_nms.cu) from C/C++.
 *
 * The TensorRT plugin (vdet_plugin.cpp) calls this; it is the C++ twin of
 * vdet.cuda.ops.GpuOps._decode_nms and decode_nms_layout, which launch the very same kernels
 * from Python through NVRTC. Both must agree on the workspace layout and the launch shapes that
 * decode_nms.cu documents; plugins/tests/plugin_harness.cpp and
 * tests/tensorrt/test_tensorrt_plugin_emulated.py check this one against the CPU reference.
 *
 * Built two ways:
 *   - for the GPU (default): kernels through cudaLaunchKernel, handles from decode_nms_kernels.cu;
 *   - with VDET_LAUNCH_EMULATION: kernels through emu_launch of the CPU emulator
 *     (tests/support/kernels/emu), "device" pointers are host pointers, streams are ignored.
 *
 * There is no class filter here (the plugin has none), so use_filter is always 0.
 */
#ifndef VDET_DECODE_NMS_LAUNCH_H
#define VDET_DECODE_NMS_LAUNCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef VDET_LAUNCH_EMULATION
typedef void* vdet_stream_t;
#else
#include <cuda_runtime_api.h>
typedef cudaStream_t vdet_stream_t;
#endif

typedef struct VdetDecodeNmsParams {
    float score_threshold; /* keep an anchor when its best score > this (strict) */
    float iou_threshold;   /* suppress when IoU > this (strict) */
    int top_k;             /* candidates entering NMS, 1..VDET_MAX_TOP_K */
    int max_det;           /* detections kept per image, >= 1 */
    int class_agnostic;    /* 0: suppress within a class only */
} VdetDecodeNmsParams;

/* 0 when the parameters are usable, else a negative code (see vdet_decode_nms_error). */
int vdet_decode_nms_check(const VdetDecodeNmsParams* params);

/* Bytes of scratch memory one call needs for `batch` images of `num_anchors` anchors. */
size_t vdet_decode_nms_workspace_bytes(int batch, int num_anchors, int top_k);

/* Queue decode + NMS of raw [batch, 4 + num_classes, num_anchors] (float32, or IEEE half bits
 * when raw_is_half) on `stream`:
 *   out    [batch, max_det, 6] float32  x1, y1, x2, y2, score, class; zero after the last box
 *   count  [batch] int32                kept boxes per image
 * `workspace` holds at least vdet_decode_nms_workspace_bytes(...) bytes, 256-byte aligned.
 * `max_shared_bytes` is the dynamic shared memory one block may opt in to on this device
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin). Nothing is synchronised.
 * Returns 0, or a non-zero code: negative for an argument error, else the CUDA error. */
int vdet_decode_nms_launch(const void* raw, int raw_is_half, int batch, int num_classes,
                           int num_anchors, const VdetDecodeNmsParams* params, float* out,
                           int* count, void* workspace, size_t workspace_bytes,
                           int max_shared_bytes, vdet_stream_t stream);

/* A message for a code returned by the functions above (static storage, or thread-local text
 * for emulator errors). */
const char* vdet_decode_nms_error(int code);

#ifdef __cplusplus
}
#endif

#endif /* VDET_DECODE_NMS_LAUNCH_H */
