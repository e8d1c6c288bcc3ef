/* Letterbox preprocess: BGR uint8, NV12 or P016 frames -> padded, normalised RGB NCHW (fp32 /
 * fp16).
 *
 * The contract is docs/conventions.md ("Letterbox pixels"): one output pixel per thread;
 * outside the resized area the value is VDET_PAD_VALUE / 255 (bit exact); inside it, the source
 * is sampled bilinearly with half-pixel centres and replicated borders exactly as OpenCV's
 * INTER_LINEAR does, the result rounded to uint8 (half up, as OpenCV's fixed point rounds), then
 * divided by 255 (VDET_UNIT_SCALE) as an IEEE division. Where the frame needs no resize the copy is bit exact; elsewhere
 * the float weights differ from OpenCV's 11-bit fixed-point ones by at most 1 in 255.
 *
 * NV12 frames are converted per source pixel (nearest chroma sample, as cv2's NV12 conversion
 * does) to RGB uint8 first, with the coefficients in VdetYuvCoefficients, so that "convert to
 * BGR, then letterbox" on the CPU is the reference for this path too.
 *
 * P016 frames (NVDEC's surface for 10- and 12-bit video: the NV12 layout with 16-bit samples,
 * each holding its value in the high bits) are brought to the 8-bit scale per sample first, by
 * VdetSampleScale (vdet_kernels.h), then converted exactly as NV12 is.
 */
#ifndef VDET_PREPROCESS_CUH
#define VDET_PREPROCESS_CUH

#include "common.cuh"

struct VdetRgb {
    int r;
    int g;
    int b;
};

/* Nearest integer (ties to even), clamped to [0, 255]: the YUV conversion's rounding. */
__device__ __forceinline__ int vdet_u8_rn(float v) {
    const int i = __float2int_rn(v);
    return i < 0 ? 0 : (i > 255 ? 255 : i);
}

/* floor(v + 0.5) clamped to [0, 255]: OpenCV's rounding of interpolated uint8 values. */
__device__ __forceinline__ int vdet_u8_half_up(float v) {
    const int i = __float2int_rd(__fadd_rn(v, 0.5f));
    return i < 0 ? 0 : (i > 255 ? 255 : i);
}

__device__ __forceinline__ VdetRgb vdet_fetch_bgr(const VdetFrame& f, int x, int y) {
    const unsigned char* p =
        reinterpret_cast<const unsigned char*>(f.plane0) + (long long)y * f.pitch0 + 3 * x;
    VdetRgb c;
    c.b = p[0];
    c.g = p[1];
    c.r = p[2];
    return c;
}

/* Y, U, V on the 8-bit scale -> rounded RGB (vdet_kernels.h, VdetYuvCoefficients). */
__device__ __forceinline__ VdetRgb vdet_yuv8_to_rgb(
    const VdetYuvCoefficients& k, float y8, float u8, float v8) {
    const float luma = __fmul_rn(__fsub_rn(y8, k.y_offset), k.y_scale);
    const float u = __fsub_rn(u8, (float)VDET_CHROMA_OFFSET);
    const float v = __fsub_rn(v8, (float)VDET_CHROMA_OFFSET);
    VdetRgb c;
    c.r = vdet_u8_rn(__fadd_rn(luma, __fmul_rn(k.r_v, v)));
    c.g = vdet_u8_rn(__fsub_rn(__fsub_rn(luma, __fmul_rn(k.g_u, u)), __fmul_rn(k.g_v, v)));
    c.b = vdet_u8_rn(__fadd_rn(luma, __fmul_rn(k.b_u, u)));
    return c;
}

__device__ __forceinline__ VdetRgb vdet_fetch_nv12(
    const VdetFrame& f, const VdetYuvCoefficients& k, int x, int y) {
    const unsigned char* yp =
        reinterpret_cast<const unsigned char*>(f.plane0) + (long long)y * f.pitch0 + x;
    const unsigned char* uvp = reinterpret_cast<const unsigned char*>(f.plane1) +
                               (long long)(y >> 1) * f.pitch1 + ((x >> 1) << 1);
    return vdet_yuv8_to_rgb(k, (float)yp[0], (float)uvp[0], (float)uvp[1]);
}

/* A 16-bit sample's value on the 8-bit scale: luma v * scale, chroma (v - center) * scale +
 * VDET_CHROMA_OFFSET, with v = sample >> shift (exact for limited range: scale is a power of
 * two). */
__device__ __forceinline__ float vdet_luma8(const VdetSampleScale& s, unsigned short sample) {
    return __fmul_rn((float)(sample >> s.shift), s.scale);
}

__device__ __forceinline__ float vdet_chroma8(const VdetSampleScale& s, unsigned short sample) {
    const float v = __fsub_rn((float)(sample >> s.shift), s.center);
    return __fadd_rn(__fmul_rn(v, s.scale), (float)VDET_CHROMA_OFFSET);
}

__device__ __forceinline__ VdetRgb vdet_fetch_p016(
    const VdetFrame& f, const VdetYuvCoefficients& k, const VdetSampleScale& s, int x, int y) {
    const unsigned char* y_row =
        reinterpret_cast<const unsigned char*>(f.plane0) + (long long)y * f.pitch0;
    const unsigned char* uv_row =
        reinterpret_cast<const unsigned char*>(f.plane1) + (long long)(y >> 1) * f.pitch1;
    const unsigned short* yp = reinterpret_cast<const unsigned short*>(y_row) + x;
    const unsigned short* uvp = reinterpret_cast<const unsigned short*>(uv_row) + ((x >> 1) << 1);
    return vdet_yuv8_to_rgb(
        k, vdet_luma8(s, yp[0]), vdet_chroma8(s, uvp[0]), vdet_chroma8(s, uvp[1]));
}

/* The surfaces a letterbox kernel reads. */
#define VDET_SURFACE_BGR 0
#define VDET_SURFACE_NV12 1
#define VDET_SURFACE_P016 2

template <int kSurface>
__device__ __forceinline__ VdetRgb vdet_fetch(
    const VdetFrame& f, const VdetYuvCoefficients& k, const VdetSampleScale& s, int x, int y) {
    if (kSurface == VDET_SURFACE_P016) return vdet_fetch_p016(f, k, s, x, y);
    if (kSurface == VDET_SURFACE_NV12) return vdet_fetch_nv12(f, k, x, y);
    return vdet_fetch_bgr(f, x, y);
}

/* Source taps and weight along one axis: OpenCV's INTER_LINEAR,
 * s = (d + 0.5) * (src / dst) - 0.5, clamped to the first / last pixel. */
__device__ __forceinline__ void vdet_linear_taps(
    int d, int src, int dst, int& i0, int& i1, float& weight1) {
    const float scale = __fdiv_rn((float)src, (float)dst);
    const float s = __fsub_rn(__fmul_rn(__fadd_rn((float)d, 0.5f), scale), 0.5f);
    const float base = floorf(s);
    int i = (int)base;
    float a = __fsub_rn(s, base);
    if (i < 0) {
        i = 0;
        a = 0.0f;
    }
    if (i >= src - 1) {
        i = src - 1;
        a = 0.0f;
    }
    i0 = i;
    i1 = vdet_min(i + 1, src - 1);
    weight1 = a;
}

__device__ __forceinline__ int vdet_lerp2(int p00, int p01, int p10, int p11, float ax, float ay) {
    const float bx = __fsub_rn(1.0f, ax);
    const float by = __fsub_rn(1.0f, ay);
    const float top = __fadd_rn(__fmul_rn((float)p00, bx), __fmul_rn((float)p01, ax));
    const float bottom = __fadd_rn(__fmul_rn((float)p10, bx), __fmul_rn((float)p11, ax));
    return vdet_u8_half_up(__fadd_rn(__fmul_rn(top, by), __fmul_rn(bottom, ay)));
}

template <int kSurface>
__device__ __forceinline__ VdetRgb vdet_bilinear(
    const VdetFrame& f, const VdetYuvCoefficients& k, const VdetSampleScale& s, int dx, int dy) {
    int x0, x1, y0, y1;
    float ax, ay;
    vdet_linear_taps(dx, f.src_w, f.new_w, x0, x1, ax);
    vdet_linear_taps(dy, f.src_h, f.new_h, y0, y1, ay);
    const VdetRgb p00 = vdet_fetch<kSurface>(f, k, s, x0, y0);
    const VdetRgb p01 = vdet_fetch<kSurface>(f, k, s, x1, y0);
    const VdetRgb p10 = vdet_fetch<kSurface>(f, k, s, x0, y1);
    const VdetRgb p11 = vdet_fetch<kSurface>(f, k, s, x1, y1);
    VdetRgb c;
    c.r = vdet_lerp2(p00.r, p01.r, p10.r, p11.r, ax, ay);
    c.g = vdet_lerp2(p00.g, p01.g, p10.g, p11.g, ax, ay);
    c.b = vdet_lerp2(p00.b, p01.b, p10.b, p11.b, ax, ay);
    return c;
}

/* Grid: (ceil(out_w / blockDim.x), ceil(out_h / blockDim.y), frames); frame z writes
 * out[z, 0:3, :, :]. */
template <typename Out, int kSurface>
__device__ __forceinline__ void vdet_letterbox(
    const VdetFrameBatch& batch, const VdetYuvCoefficients& yuv, const VdetSampleScale& sample,
    Out* out, int out_h, int out_w) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= out_w || y >= out_h) return;
    const VdetFrame f = batch.frames[blockIdx.z];
    const long long plane = (long long)out_h * out_w;
    Out* o = out + (long long)blockIdx.z * 3 * plane + (long long)y * out_w + x;
    const int dx = x - f.left;
    const int dy = y - f.top;
    float r, g, b;
    if (dx < 0 || dy < 0 || dx >= f.new_w || dy >= f.new_h) {
        r = g = b = __fdiv_rn((float)VDET_PAD_VALUE, (float)VDET_UNIT_SCALE);
    } else {
        VdetRgb c;
        if (f.new_w == f.src_w && f.new_h == f.src_h) {
            c = vdet_fetch<kSurface>(f, yuv, sample, dx, dy);
        } else {
            c = vdet_bilinear<kSurface>(f, yuv, sample, dx, dy);
        }
        r = __fdiv_rn((float)c.r, (float)VDET_UNIT_SCALE);
        g = __fdiv_rn((float)c.g, (float)VDET_UNIT_SCALE);
        b = __fdiv_rn((float)c.b, (float)VDET_UNIT_SCALE);
    }
    vdet_store(o, r);
    vdet_store(o + plane, g);
    vdet_store(o + 2 * plane, b);
}

#endif /* VDET_PREPROCESS_CUH */
