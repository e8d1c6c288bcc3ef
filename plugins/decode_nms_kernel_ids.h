/* Which decode + NMS kernel: shared by decode_nms_kernels.cu (handles) and
 * decode_nms_launch.cpp (launches). Internal to the plugin library. */
#ifndef VDET_DECODE_NMS_KERNEL_IDS_H
#define VDET_DECODE_NMS_KERNEL_IDS_H

enum VdetKernelId {
    VDET_KERNEL_DECODE_F32 = 0,
    VDET_KERNEL_DECODE_F16 = 1,
    VDET_KERNEL_SELECT_F32 = 2,
    VDET_KERNEL_SELECT_F16 = 3,
    VDET_KERNEL_NMS_MASK = 4,
    VDET_KERNEL_NMS_SCAN = 5,
};

#ifdef __cplusplus
extern "C" {
#endif
/* The cudaLaunchKernel handle of one kernel, or NULL for an unknown id. */
const void* vdet_decode_nms_kernel(int id);
#ifdef __cplusplus
}
#endif

#endif /* VDET_DECODE_NMS_KERNEL_IDS_H */
