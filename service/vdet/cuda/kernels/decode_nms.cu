/* Launchable decode + NMS kernels (see decode_nms.cuh for the algorithm and workspace).
 *
 * Per batch of B images, on one stream, in this order:
 *   memset counts[0:B] = 0
 *   vdet_decode_candidates_{f32,f16}  grid (ceil(N / 32), B)     block (32, 8)
 *   vdet_select_topk_{f32,f16}        grid (B)                   block (1024)
 *       dynamic smem VDET_SELECT_SMEM_HEADER + 8 * (pow2 >= top_k) + 8 * stage_cap
 *       (exactly VDET_SELECT_THREADS threads: its sort takes up to VDET_SORT_PER_THREAD keys
 *       per thread, its bucket scan VDET_SELECT_BINS / 1024 bins)
 *   vdet_nms_mask                     grid (words, words, B)     block (64 * L), L = 1..16
 *       (L threads per candidate row; VDET_MASK_THREADS = 256 is what vdet uses)
 *   vdet_nms_scan                     grid (B)                   block (512)
 *       dynamic smem VDET_SCAN_SMEM_HEADER + 8 * 64 * words * (words + 1) / 2 + 4 * max_keep
 *       (the whole mask triangle, loaded at once: fastest) where the device allows it, else at
 *       least VDET_SCAN_SMEM_HEADER + 2 * 64 * 8 * words + 4 * max_keep (tile at a time)
 * where words = ceil(top_k / 64), cand_cap = 64 * words, max_keep = min(max_det, cand_cap) and
 * stage_cap (how many keys vdet_select_topk may copy to shared memory; 0 reads them from global
 * memory) is chosen by the host from the shared memory the device allows.
 */
#include "decode_nms.cuh"

extern "C" __global__ void __launch_bounds__(256) vdet_decode_candidates_f32(
    const float* __restrict__ raw, int nc, int n_anchors, float conf, int use_filter,
    const __grid_constant__ VdetClassMask filter, unsigned int* __restrict__ counts,
    vdet_u64* __restrict__ keys, int* __restrict__ best_class) {
    vdet_decode_candidates<float>(raw, nc, n_anchors, conf, use_filter, filter, counts, keys,
                                  best_class);
}

extern "C" __global__ void __launch_bounds__(256) vdet_decode_candidates_f16(
    const unsigned short* __restrict__ raw, int nc, int n_anchors, float conf, int use_filter,
    const __grid_constant__ VdetClassMask filter, unsigned int* __restrict__ counts,
    vdet_u64* __restrict__ keys, int* __restrict__ best_class) {
    vdet_decode_candidates<unsigned short>(raw, nc, n_anchors, conf, use_filter, filter, counts,
                                           keys, best_class);
}

extern "C" __global__ void __launch_bounds__(VDET_SELECT_THREADS) vdet_select_topk_f32(
    const float* __restrict__ raw, int nc, int n_anchors, int top_k, float conf,
    int stage_cap, const unsigned int* __restrict__ counts, const vdet_u64* __restrict__ keys,
    const int* __restrict__ best_class, int cand_cap, unsigned int* __restrict__ cand_count,
    VdetBox* __restrict__ cand_box, float* __restrict__ cand_score, int* __restrict__ cand_class,
    int* __restrict__ cand_anchor) {
    vdet_select_topk<float>(raw, nc, n_anchors, top_k, conf, stage_cap, counts, keys, best_class,
                            cand_cap, cand_count, cand_box, cand_score, cand_class, cand_anchor);
}

extern "C" __global__ void __launch_bounds__(VDET_SELECT_THREADS) vdet_select_topk_f16(
    const unsigned short* __restrict__ raw, int nc, int n_anchors, int top_k, float conf,
    int stage_cap, const unsigned int* __restrict__ counts, const vdet_u64* __restrict__ keys,
    const int* __restrict__ best_class, int cand_cap, unsigned int* __restrict__ cand_count,
    VdetBox* __restrict__ cand_box, float* __restrict__ cand_score, int* __restrict__ cand_class,
    int* __restrict__ cand_anchor) {
    vdet_select_topk<unsigned short>(raw, nc, n_anchors, top_k, conf, stage_cap, counts, keys,
                                     best_class, cand_cap, cand_count, cand_box, cand_score,
                                     cand_class, cand_anchor);
}

extern "C" __global__ void __launch_bounds__(VDET_MASK_THREADS) vdet_nms_mask(
    const unsigned int* __restrict__ cand_count, const VdetBox* __restrict__ cand_box,
    const int* __restrict__ cand_class, int cand_cap, int words, float iou_threshold,
    int agnostic, vdet_u64* __restrict__ mask) {
    vdet_nms_mask_tile(cand_count, cand_box, cand_class, cand_cap, words, iou_threshold,
                       agnostic, mask);
}

/* One block per image, with most of the shared memory: registers need not leave room for more. */
extern "C" __global__ void __launch_bounds__(VDET_SCAN_THREADS, 1) vdet_nms_scan(
    const unsigned int* __restrict__ cand_count, const VdetBox* __restrict__ cand_box,
    const float* __restrict__ cand_score, const int* __restrict__ cand_class,
    const int* __restrict__ cand_anchor, int cand_cap, int words,
    const vdet_u64* __restrict__ mask, int max_det, int max_keep, float* __restrict__ out,
    int* __restrict__ out_count, int* __restrict__ out_anchor) {
    vdet_nms_sweep(cand_count, cand_box, cand_score, cand_class, cand_anchor, cand_cap, words,
                   mask, max_det, max_keep, out, out_count, out_anchor);
}
