/* The decode + NMS kernels of service/vdet/cuda/kernels/decode_nms.cu, compiled into the plugin
 * library, and the handles decode_nms_launch.cpp launches them by (a __global__ function's host
 * stub address is its cudaLaunchKernel handle). Nothing else lives here: the kernels are the
 * same source the Python launcher compiles with NVRTC.
 */
#include "kernels/decode_nms.cu"

#include "decode_nms_kernel_ids.h"

extern "C" const void* vdet_decode_nms_kernel(int id) {
    switch (id) {
        case VDET_KERNEL_DECODE_F32: return reinterpret_cast<const void*>(&vdet_decode_candidates_f32);
        case VDET_KERNEL_DECODE_F16: return reinterpret_cast<const void*>(&vdet_decode_candidates_f16);
        case VDET_KERNEL_SELECT_F32: return reinterpret_cast<const void*>(&vdet_select_topk_f32);
        case VDET_KERNEL_SELECT_F16: return reinterpret_cast<const void*>(&vdet_select_topk_f16);
        case VDET_KERNEL_NMS_MASK: return reinterpret_cast<const void*>(&vdet_nms_mask);
        case VDET_KERNEL_NMS_SCAN: return reinterpret_cast<const void*>(&vdet_nms_scan);
        default: return nullptr;
    }
}
