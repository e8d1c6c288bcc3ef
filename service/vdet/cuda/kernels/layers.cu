/* Network layers the torch backend runs as its own kernels: FP16, channels_last (NHWC).
 *
 * Why: at batch 1 a YOLOv8 network's time on a large GPU is its kernels one after another, not
 * arithmetic. PyTorch runs a convolution's bias as a separate elementwise kernel after the
 * convolution and the SiLU as another; its NHWC max pool launches too few blocks for the
 * small feature maps of SPPF (about 40 us for a 5x5 pool of 20x12x512 on an H200). These two
 * kernels replace the bias add + SiLU pair by one pass, and the pool by one thread per output.
 * vdet.inference.backends.torch_layers rewrites the converted network to call them.
 *
 * vdet_layer_bias_silu_f16: x[i] = silu(x[i] + bias[i % channels]) in place, over `count`
 *   halves of a contiguous NHWC tensor (channels is the innermost dimension). Arithmetic in
 *   float32, one rounding to half at the end: x + b, then y * (1 / (1 + exp(-y))).
 *   Launch: block (256, 1, 1); grid (ceil(count / 256), 1, 1).
 * vdet_layer_max_pool_nhwc_f16: out[n, y, x, c] = max over the `kernel` x `kernel` window
 *   centred on (y, x) (stride 1, padding kernel / 2, padded cells ignored: PyTorch's
 *   MaxPool2d(kernel, 1, kernel // 2)), `in` and `out` contiguous NHWC of equal shape.
 *   A NaN in the window gives NaN, as in PyTorch.
 *   Launch: block (256, 1, 1); grid (ceil(batch * height * width * channels / 256), 1, 1).
 */
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) vdet_layer_bias_silu_f16(
    unsigned short* __restrict__ x, const unsigned short* __restrict__ bias, vdet_u64 count,
    int channels) {
    const vdet_u64 i = (vdet_u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float y = __fadd_rn(vdet_h2f(x[i]), vdet_h2f(bias[i % (vdet_u64)channels]));
    const float gate = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-y)));
    x[i] = vdet_f2h(__fmul_rn(y, gate));
}

extern "C" __global__ void __launch_bounds__(256) vdet_layer_max_pool_nhwc_f16(
    const unsigned short* __restrict__ in, unsigned short* __restrict__ out, int batch,
    int height, int width, int channels, int kernel) {
    const vdet_u64 i = (vdet_u64)blockIdx.x * blockDim.x + threadIdx.x;
    const vdet_u64 total = (vdet_u64)batch * height * width * channels;
    if (i >= total) return;
    const int c = (int)(i % (vdet_u64)channels);
    vdet_u64 rest = i / (vdet_u64)channels;
    const int x = (int)(rest % (vdet_u64)width);
    rest /= (vdet_u64)width;
    const int y = (int)(rest % (vdet_u64)height);
    const int n = (int)(rest / (vdet_u64)height);
    const int half = kernel / 2;
    const int y0 = vdet_max(y - half, 0), y1 = vdet_min(y + half, height - 1);
    const int x0 = vdet_max(x - half, 0), x1 = vdet_min(x + half, width - 1);
    float best = vdet_h2f(in[i]);  // the centre is always inside
    bool nan = best != best;
    for (int yy = y0; yy <= y1; ++yy) {
        const vdet_u64 row = ((vdet_u64)n * height + yy) * width;
        for (int xx = x0; xx <= x1; ++xx) {
            const float v = vdet_h2f(in[(row + xx) * channels + c]);
            nan = nan || v != v;
            best = v > best ? v : best;
        }
    }
    // Max of halves is one of them: converting back is exact.
    out[i] = nan ? (unsigned short)0x7e00u : vdet_f2h(best);
}
