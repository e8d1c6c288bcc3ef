/* Host-side launch of the decode + NMS kernels; see decode_nms_launch.h.
 *
 * Workspace layout and launch shapes mirror vdet.cuda.ops (decode_nms_layout and
 * GpuOps._decode_nms), which follow service/vdet/cuda/kernels/decode_nms.cu:
 *
 *   memset counts[0:B] = 0
 *   decode_candidates  grid (ceil(N / 32), B)  block (32, 8)
 *   select_topk        grid (B)                block (1024)  smem 9792 + 8 * pow2(top_k) + 8 * stage
 *   nms_mask           grid (words, words, B)  block (256)
 *   nms_scan           grid (B)                block (512)   smem: the whole mask triangle
 *       (512 + 256 * words * (words + 1) + 4 * keep) when the device allows it, else two row
 *       tiles (512 + 1024 * words + 4 * keep); the kernel picks its mode from the size.
 */
#include "decode_nms_launch.h"

#include <stdint.h>
#include <string.h>

#include <string>

#include "decode_nms_kernel_ids.h"
#include "kernels/vdet_kernels.h"

#ifdef VDET_LAUNCH_EMULATION
extern "C" int emu_launch(const char* name, unsigned int gx, unsigned int gy, unsigned int gz,
                          unsigned int bx, unsigned int by, unsigned int bz,
                          unsigned int shared_bytes, void** params, unsigned int seed,
                          char* error, int error_bytes);
#endif

// A macro's value as a string literal (the limits in the error messages come from the header).
#define VDET_STRINGIFY_VALUE(x) #x
#define VDET_STRINGIFY(x) VDET_STRINGIFY_VALUE(x)

namespace {

constexpr size_t kAlign = 256;
constexpr int kSelectThreads = 1024;
constexpr int kMaskThreads = 256;  // VDET_MASK_THREADS of decode_nms.cuh (its launch bound)
constexpr int kScanThreads = 512;
constexpr int kSelectSmemHeader = 2048 * 4 + 256 * 4 + 64 * 8 + 16 * 4;
constexpr int kScanSmemHeader = 64 * 8;
constexpr int kScanStaticSmem = 16;  // vdet_nms_scan's own __shared__ scalars
constexpr int kDefaultSharedBytes = 48 * 1024;  // what every block gets without opting in
constexpr int kMaxGridY = 65535;

enum : int {
    kErrParams = -1,
    kErrShape = -2,
    kErrWorkspace = -3,
    kErrSharedMemory = -4,
    kErrEmulator = -5,
    kErrNoKernel = -6,
};

size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

struct Layout {
    size_t counts, cand_count, keys, best_class, cand_box, cand_score, cand_class, cand_anchor,
        mask, nbytes;
    int words, cand_cap;
};

Layout layout_for(int batch, int anchors, int top_k) {
    Layout l{};
    l.words = (top_k + 63) / 64;
    l.cand_cap = l.words * 64;
    const size_t b = (size_t)batch, n = (size_t)anchors, cap = (size_t)l.cand_cap;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
        const size_t offset = at;
        at += aligned(bytes);
        return offset;
    };
    l.counts = take(4 * b);
    l.cand_count = take(4 * b);
    l.keys = take(8 * b * n);
    l.best_class = take(4 * b * n);
    l.cand_box = take(16 * b * cap);
    l.cand_score = take(4 * b * cap);
    l.cand_class = take(4 * b * cap);
    l.cand_anchor = take(4 * b * cap);
    l.mask = take(8 * b * cap * (size_t)l.words);
    l.nbytes = at;
    return l;
}

#ifdef VDET_LAUNCH_EMULATION
thread_local std::string g_emulator_error;

const char* kernel_name(int id) {
    static const char* const names[] = {
        "vdet_decode_candidates_f32", "vdet_decode_candidates_f16", "vdet_select_topk_f32",
        "vdet_select_topk_f16",       "vdet_nms_mask",              "vdet_nms_scan",
    };
    return names[id];
}

int launch(int id, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
           size_t smem, vdet_stream_t, void** args) {
    char error[512];
    if (emu_launch(kernel_name(id), gx, gy, gz, bx, by, bz, (unsigned)smem, args, 0, error,
                   (int)sizeof(error)) != 0) {
        g_emulator_error = error;
        return kErrEmulator;
    }
    return 0;
}

int zero(void* ptr, size_t bytes, vdet_stream_t) {
    memset(ptr, 0, bytes);
    return 0;
}

int allow_shared(int, size_t) { return 0; }
#else
int launch(int id, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
           size_t smem, vdet_stream_t stream, void** args) {
    const void* kernel = vdet_decode_nms_kernel(id);
    if (kernel == nullptr) return kErrNoKernel;
    return (int)cudaLaunchKernel(kernel, dim3(gx, gy, gz), dim3(bx, by, bz), args, smem, stream);
}

int zero(void* ptr, size_t bytes, vdet_stream_t stream) {
    return (int)cudaMemsetAsync(ptr, 0, bytes, stream);
}

/* Above 48 KiB a kernel must opt in to its dynamic shared memory. Setting the attribute is not
 * a stream operation, so it is allowed while the stream is being captured into a CUDA graph. */
int allow_shared(int id, size_t smem) {
    if (smem <= (size_t)kDefaultSharedBytes) return 0;
    const void* kernel = vdet_decode_nms_kernel(id);
    if (kernel == nullptr) return kErrNoKernel;
    return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem);
}
#endif

}  // namespace

extern "C" int vdet_decode_nms_check(const VdetDecodeNmsParams* p) {
    if (p == nullptr) return kErrParams;
    if (!(p->score_threshold >= 0.0f && p->score_threshold <= 1.0f)) return kErrParams;
    if (!(p->iou_threshold >= 0.0f && p->iou_threshold <= 1.0f)) return kErrParams;
    if (p->top_k < 1 || p->top_k > VDET_MAX_TOP_K || p->max_det < 1) return kErrParams;
    if (p->class_agnostic != 0 && p->class_agnostic != 1) return kErrParams;
    return 0;
}

extern "C" size_t vdet_decode_nms_workspace_bytes(int batch, int num_anchors, int top_k) {
    if (batch < 0 || num_anchors < 0 || top_k < 1 || top_k > VDET_MAX_TOP_K) return 0;
    return layout_for(batch, num_anchors, top_k).nbytes;
}

extern "C" int vdet_decode_nms_launch(const void* raw, int raw_is_half, int batch, int num_classes,
                                      int num_anchors, const VdetDecodeNmsParams* params,
                                      float* out, int* count, void* workspace,
                                      size_t workspace_bytes, int max_shared_bytes,
                                      vdet_stream_t stream) {
    if (const int bad = vdet_decode_nms_check(params)) return bad;
    if (batch < 0 || batch > kMaxGridY || num_classes < 1 || num_anchors < 0) return kErrShape;
    if ((int64_t)(4 + num_classes) * num_anchors >= ((int64_t)1 << 31)) return kErrShape;
    if (batch == 0) return 0;
    const VdetDecodeNmsParams& p = *params;
    const Layout l = layout_for(batch, num_anchors, p.top_k);
    if (workspace == nullptr || workspace_bytes < l.nbytes ||
        reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
        return kErrWorkspace;
    }
    unsigned char* base = static_cast<unsigned char*>(workspace);
    void* counts = base + l.counts;
    void* cand_count = base + l.cand_count;
    void* keys = base + l.keys;
    void* best_class = base + l.best_class;
    void* cand_box = base + l.cand_box;
    void* cand_score = base + l.cand_score;
    void* cand_class = base + l.cand_class;
    void* cand_anchor = base + l.cand_anchor;
    void* mask = base + l.mask;
    void* no_anchors = nullptr;
    int nc = num_classes, n = num_anchors, top_k = p.top_k, cap = l.cand_cap, words = l.words;
    int max_det = p.max_det, agnostic = p.class_agnostic, use_filter = 0;
    float conf = p.score_threshold, iou = p.iou_threshold;
    VdetClassMask no_filter;
    memset(&no_filter, 0, sizeof(no_filter));
    const int half = raw_is_half ? 1 : 0;

    int status = zero(counts, 4 * (size_t)batch, stream);
    if (status != 0) return status;

    {
        void* args[] = {&raw, &nc, &n, &conf, &use_filter, &no_filter, &counts, &keys, &best_class};
        const unsigned blocks = (unsigned)(num_anchors + 31) / 32;
        status = launch(VDET_KERNEL_DECODE_F32 + half, blocks > 0 ? blocks : 1, (unsigned)batch,
                        1, 32, 8, 1, 0, stream, args);
        if (status != 0) return status;
    }
    {
        const int fixed = kSelectSmemHeader + 8 * pow2_at_least(top_k);
        const int shared = max_shared_bytes > 0 ? max_shared_bytes : kDefaultSharedBytes;
        if (fixed > shared) return kErrSharedMemory;
        int stage_cap = (shared - fixed) / 8;
        if (stage_cap > num_anchors) stage_cap = num_anchors;
        const size_t smem = (size_t)fixed + 8 * (size_t)stage_cap;
        status = allow_shared(VDET_KERNEL_SELECT_F32 + half, smem);
        if (status != 0) return status;
        void* args[] = {&raw,        &nc,       &n,          &top_k,      &conf,
                        &stage_cap,  &counts,   &keys,       &best_class, &cap,
                        &cand_count, &cand_box, &cand_score, &cand_class, &cand_anchor};
        status = launch(VDET_KERNEL_SELECT_F32 + half, (unsigned)batch, 1, 1, kSelectThreads, 1, 1,
                        smem, stream, args);
        if (status != 0) return status;
    }
    {
        void* args[] = {&cand_count, &cand_box, &cand_class, &cap, &words, &iou, &agnostic, &mask};
        status = launch(VDET_KERNEL_NMS_MASK, (unsigned)words, (unsigned)words, (unsigned)batch,
                        kMaskThreads, 1, 1, 0, stream, args);
        if (status != 0) return status;
    }
    {
        int max_keep = max_det < cap ? max_det : cap;
        const int shared = max_shared_bytes > 0 ? max_shared_bytes : kDefaultSharedBytes;
        const size_t keep_bytes = 4 * (size_t)max_keep;
        const size_t triangle = (size_t)kScanSmemHeader +
                                8 * 64 * (size_t)words * ((size_t)words + 1) / 2 + keep_bytes;
        const size_t tiles = (size_t)kScanSmemHeader + 2 * 64 * 8 * (size_t)words + keep_bytes;
        const size_t smem = triangle + kScanStaticSmem <= (size_t)shared ? triangle : tiles;
        if (smem + kScanStaticSmem > (size_t)shared) return kErrSharedMemory;
        status = allow_shared(VDET_KERNEL_NMS_SCAN, smem);
        if (status != 0) return status;
        void* args[] = {&cand_count, &cand_box, &cand_score, &cand_class, &cand_anchor,
                        &cap,        &words,    &mask,       &max_det,    &max_keep,
                        &out,        &count,    &no_anchors};
        status = launch(VDET_KERNEL_NMS_SCAN, (unsigned)batch, 1, 1, kScanThreads, 1, 1, smem,
                        stream, args);
    }
    return status;
}

extern "C" const char* vdet_decode_nms_error(int code) {
    switch (code) {
        case 0: return "no error";
        case kErrParams:
            return "invalid decode + NMS parameters (thresholds in [0, 1], 1 <= top_k <= "
                   VDET_STRINGIFY(VDET_MAX_TOP_K) ", max_det >= 1, class_agnostic 0 or 1)";
        case kErrShape: return "invalid raw head shape (batch <= 65535, >= 1 class)";
        case kErrWorkspace: return "workspace missing, too small or not 256-byte aligned";
        case kErrSharedMemory: return "top_k / max_det need more shared memory than the device has";
        case kErrNoKernel: return "decode + NMS kernel handle missing";
#ifdef VDET_LAUNCH_EMULATION
        case kErrEmulator: return g_emulator_error.c_str();
#endif
        default: break;
    }
#ifdef VDET_LAUNCH_EMULATION
    return "unknown error";
#else
    return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
#endif
}
