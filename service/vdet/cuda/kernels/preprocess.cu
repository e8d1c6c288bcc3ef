/* Launchable letterbox kernels (see preprocess.cuh for the pixel rules): BGR, NV12, P016.
 *
 * Launch: block (32, 8, 1); grid (ceil(out_w / 32), ceil(out_h / 8), frames) with
 * frames <= VDET_MAX_FRAMES; `out` is a contiguous [frames, 3, out_h, out_w] tensor of float32
 * (_f32) or IEEE half bits (_f16). `batch` holds one VdetFrame per grid z, geometry from
 * compute_letterbox on the host.
 */
#include "preprocess.cuh"

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_bgr_f32(
    const __grid_constant__ VdetFrameBatch batch, float* __restrict__ out, int out_h, int out_w) {
    const VdetYuvCoefficients unused = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const VdetSampleScale eight_bit = {0, 1.0f, 0.0f};
    vdet_letterbox<float, VDET_SURFACE_BGR>(batch, unused, eight_bit, out, out_h, out_w);
}

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_bgr_f16(
    const __grid_constant__ VdetFrameBatch batch, unsigned short* __restrict__ out, int out_h,
    int out_w) {
    const VdetYuvCoefficients unused = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const VdetSampleScale eight_bit = {0, 1.0f, 0.0f};
    vdet_letterbox<unsigned short, VDET_SURFACE_BGR>(batch, unused, eight_bit, out, out_h, out_w);
}

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_nv12_f32(
    const __grid_constant__ VdetFrameBatch batch, const VdetYuvCoefficients yuv,
    float* __restrict__ out, int out_h, int out_w) {
    const VdetSampleScale eight_bit = {0, 1.0f, 0.0f};
    vdet_letterbox<float, VDET_SURFACE_NV12>(batch, yuv, eight_bit, out, out_h, out_w);
}

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_nv12_f16(
    const __grid_constant__ VdetFrameBatch batch, const VdetYuvCoefficients yuv,
    unsigned short* __restrict__ out, int out_h, int out_w) {
    const VdetSampleScale eight_bit = {0, 1.0f, 0.0f};
    vdet_letterbox<unsigned short, VDET_SURFACE_NV12>(batch, yuv, eight_bit, out, out_h, out_w);
}

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_p016_f32(
    const __grid_constant__ VdetFrameBatch batch, const VdetYuvCoefficients yuv,
    const VdetSampleScale sample, float* __restrict__ out, int out_h, int out_w) {
    vdet_letterbox<float, VDET_SURFACE_P016>(batch, yuv, sample, out, out_h, out_w);
}

extern "C" __global__ void __launch_bounds__(256) vdet_letterbox_p016_f16(
    const __grid_constant__ VdetFrameBatch batch, const VdetYuvCoefficients yuv,
    const VdetSampleScale sample, unsigned short* __restrict__ out, int out_h, int out_w) {
    vdet_letterbox<unsigned short, VDET_SURFACE_P016>(batch, yuv, sample, out, out_h, out_w);
}
