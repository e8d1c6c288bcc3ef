/* Plain-C types and limits shared by the vdet CUDA kernels and whatever launches them.
 *
 * This header is included by the kernels (NVRTC at run time, or nvcc for the TensorRT plugin)
 * and may be included by host C/C++ code that fills the structs. It uses only fundamental types
 * so that the layout is the same on the host and the device; the Python launcher
 * (vdet/cuda/ops.py) mirrors these structs and limits with ctypes and tests them.
 * Geometry is never computed here: the host computes it with `compute_letterbox`
 * (docs/conventions.md) and passes integers.
 */
#ifndef VDET_KERNELS_H
#define VDET_KERNELS_H

/* The numbers shared with the CPU reference (pad value, normalisation, chroma offset, the
 * largest top_k, post-process defaults): generated from vdet.core.contract. */
#include "vdet_contract.h"

/* Frames per preprocess launch; a larger batch is split into several launches. The batch
 * travels by value as a kernel parameter (64 * 48 bytes), which keeps launches free of
 * host-to-device copies and capturable in CUDA graphs. */
#define VDET_MAX_FRAMES 64

/* Class ids a class filter can name (a bitmask passed by value). */
#define VDET_MAX_FILTER_CLASSES 1024

/* One source frame of a preprocess batch.
 * BGR input: plane0 = first byte of an HxWx3 uint8 image, pitch0 = bytes per row; plane1 unused.
 * NV12 input: plane0 = Y plane (h rows of w bytes), plane1 = interleaved UV plane
 * (ceil(h/2) rows of ceil(w/2) U,V pairs), each with its own row pitch in bytes.
 * P016 input: as NV12 with 16-bit samples (h rows of 2w bytes; U,V pairs of 4 bytes).
 * new_w, new_h, left, top: the letterbox geometry from compute_letterbox. */
typedef struct VdetFrame {
    unsigned long long plane0;
    unsigned long long plane1;
    int pitch0;
    int pitch1;
    int src_w;
    int src_h;
    int new_w;
    int new_h;
    int left;
    int top;
} VdetFrame;

typedef struct VdetFrameBatch {
    VdetFrame frames[VDET_MAX_FRAMES];
} VdetFrameBatch;

/* YUV -> RGB, per pixel, in float32 and in this order (the NumPy reference does the same):
 *   y = (Y - y_offset) * y_scale;  u = U - VDET_CHROMA_OFFSET;  v = V - VDET_CHROMA_OFFSET
 *   R = y + r_v * v;  G = (y - g_u * u) - g_v * v;  B = y + b_u * u
 * then each channel is rounded to the nearest integer (ties to even) and clamped to [0, 255].
 * The limited-range chroma gain (255 / 224) is folded into r_v, g_u, g_v and b_u; the host
 * derives all six from vdet.core.contract.yuv_coefficients and passes them as a launch argument. */
typedef struct VdetYuvCoefficients {
    float y_offset;
    float y_scale;
    float r_v;
    float g_u;
    float g_v;
    float b_u;
} VdetYuvCoefficients;

/* A P016 sample (16 bits, the value in the high `16 - shift` bits) on the 8-bit scale, in float32
 * and in this order (vdet.core.contract.sample_scale derives it; the references do the same):
 *   v = sample >> shift;  luma = v * scale;  chroma = (v - center) * scale + VDET_CHROMA_OFFSET
 * Limited range: scale = 2^-(bits - 8) and center = 2^(bits - 1), so both are exact divisions;
 * full range: scale = 255 / (2^bits - 1) rounded to float32, chroma centred on 2^(bits - 1). */
typedef struct VdetSampleScale {
    int shift;
    float scale;
    float center;
} VdetSampleScale;

/* Bit c set: class c passes the class filter. */
typedef struct VdetClassMask {
    unsigned int words[VDET_MAX_FILTER_CLASSES / 32];
} VdetClassMask;

#endif /* VDET_KERNELS_H */
