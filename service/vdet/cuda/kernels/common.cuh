/* Device helpers shared by the vdet kernels: half <-> float, exact float32 arithmetic, bits.
 *
 * The kernels compile three ways: NVRTC at run time (vdet/cuda/launch.py), nvcc inside the
 * TensorRT plugin, and a host C++ compiler with tests/gpu/emulator/emu.h force-included
 * (VDET_EMULATION), which runs them on the CPU for tests. So: no CUDA headers (NVRTC has none
 * without an include path), no C++ standard library, half precision by inline PTX, and every
 * dynamic shared-memory declaration through VDET_DYNAMIC_SMEM.
 *
 * Arithmetic that must match the CPU reference bit for bit (docs/conventions.md) uses the
 * explicitly rounded intrinsics (__fadd_rn, __fmul_rn, ...): the compiler never contracts those
 * into FMAs, whatever --fmad says.
 */
#ifndef VDET_COMMON_CUH
#define VDET_COMMON_CUH

#include "vdet_kernels.h"

#ifndef VDET_EMULATION
#define VDET_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

typedef unsigned long long vdet_u64;

/* float32 -> IEEE half bits, round to nearest even. */
__device__ __forceinline__ unsigned short vdet_f2h(float f) {
#ifdef VDET_EMULATION
    return emu::float_to_half_bits(f);
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

/* IEEE half bits -> float32 (exact). */
__device__ __forceinline__ float vdet_h2f(unsigned short h) {
#ifdef VDET_EMULATION
    return emu::half_bits_to_float(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

/* Loads one element of a float32 or float16 (stored as its bits) tensor as float32. */
__device__ __forceinline__ float vdet_load(const float* p) { return *p; }
__device__ __forceinline__ float vdet_load(const unsigned short* p) { return vdet_h2f(*p); }

__device__ __forceinline__ void vdet_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void vdet_store(unsigned short* p, float v) { *p = vdet_f2h(v); }

__device__ __forceinline__ int vdet_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int vdet_max(int a, int b) { return a > b ? a : b; }

/* Bits below `lane` (the lanes before this one in a warp). */
__device__ __forceinline__ unsigned int vdet_lanemask_lt(int lane) { return (1u << lane) - 1u; }

#endif /* VDET_COMMON_CUH */
