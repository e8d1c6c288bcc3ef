/* YOLOv8 decode + class-aware greedy NMS on the raw head [B, 4 + nc, N] (fp32 or fp16).
 *
 * The contract is docs/conventions.md ("Raw head", "Decode", "NMS"), i.e. the CPU reference
 * vdet.inference.postprocess.decode_and_nms_image. Four launches per batch, one stream:
 *
 * 1. vdet_decode_candidates: one thread per (anchor, class group); best class per anchor
 *    (lowest id on ties, NaN drops the anchor), score > conf, optional class filter; survivors
 *    are appended (in no particular order) to keys[b] as 64-bit sort keys, their class to
 *    best_class[b][anchor]. counts[b] must be zero before the launch.
 * 2. vdet_select_topk: one block per image; selects the top_k largest keys: one pass over the
 *    keys (staged in shared memory when they fit) builds a 2048-bin histogram of a score digit
 *    (conf .. 1 in equal steps of float bits) and finds the bucket of the top_k-th key; a second
 *    pass takes the keys of higher buckets and puts that bucket's keys aside; unless it is kept
 *    whole, 8-bit radix passes over the keys put aside pick the ones still needed. The selected
 *    keys are sorted by a warp-level bitonic sort of runs of 32 and rank-by-binary-search merges,
 *    and the candidates (box, score, class, anchor) written in order. Keys are unique, so the
 *    selection and the order are total and deterministic (the same as a full sort's).
 * 3. vdet_nms_mask: one block (64 * L threads) per 64 x 64 tile of the upper triangle of the
 *    candidates' suppression matrix: bit j of row i is set when j > i, the classes match
 *    (or agnostic) and IoU(i, j) > iou_threshold, computed in float32 exactly as the reference.
 * 4. vdet_nms_scan: one block per image; a greedy sweep over the bitmask, 64 candidates at a
 *    time: warp 0 resolves the 64-candidate diagonal tile (sequentially only for candidates
 *    that overlap a later one of the tile), all warps OR the kept rows into the "removed"
 *    words; the mask comes from shared memory, preloaded whole (many loads in flight) when the
 *    launch gives room for it, else a row tile at a time with the next one prefetched. Stops
 *    at max_det; writes [max_det, 6] float32 rows (x1, y1, x2, y2, score, class; zero after
 *    the last kept box), the count and optionally the kept anchor indices (-1 after the last).
 *
 * Workspace per image: keys (N u64), best_class (N i32), candidates (cand_cap of each: VdetBox,
 * float score, i32 class, i32 anchor), mask (cand_cap x words u64), plus counts / cand_count
 * (one u32 each); cand_cap = words * 64 >= top_k. vdet/cuda/ops.py computes the layout.
 */
#ifndef VDET_DECODE_NMS_CUH
#define VDET_DECODE_NMS_CUH

#include "common.cuh"

#define VDET_DECODE_ANCHORS 32 /* blockDim.x of vdet_decode_candidates: one anchor per lane */
#define VDET_DECODE_GROUPS 8   /* blockDim.y: class rows c = y, y + 8, ... per thread */
#define VDET_SELECT_THREADS 1024
#define VDET_MASK_THREADS 256 /* any 64 * L up to this launch bound works; see vdet_nms_mask_tile */
#define VDET_SCAN_THREADS 512
#define VDET_SCAN_BATCH 8 /* mask words each vdet_nms_scan thread loads at once when preloading */

#define VDET_SELECT_DIGIT_BITS 11 /* vdet_select_topk's first histogram: an 11-bit score digit */
#define VDET_SELECT_BINS 2048
#define VDET_SELECT_BOUNDARY_CAP 1024 /* boundary-bucket keys that fit in that histogram's memory */
#define VDET_SELECT_BATCH 4           /* keys each thread loads at once: loads in flight */
#define VDET_SORT_PER_THREAD 4        /* VDET_MAX_TOP_K / VDET_SELECT_THREADS */

/* Dynamic shared memory of vdet_select_topk before the selected keys: the 2048-bin histogram,
 * 256 bins for the boundary bucket's radix passes, 64 words of block scratch, 16 scalars. */
#define VDET_SELECT_SMEM_HEADER (2048 * 4 + 256 * 4 + 64 * 8 + 16 * 4)
/* Dynamic shared memory of vdet_nms_scan before its buffers: 64 "removed" words. */
#define VDET_SCAN_SMEM_HEADER (64 * 8)

struct __align__(16) VdetBox {
    float x1;
    float y1;
    float x2;
    float y2;
};

/* Score bits high (a positive float orders like its bits), inverted anchor low: sorting keys
 * in descending order gives score descending, then anchor ascending. */
__device__ __forceinline__ vdet_u64 vdet_make_key(float score, int anchor) {
    return ((vdet_u64)__float_as_uint(score) << 32) |
           (vdet_u64)(0xFFFFFFFFu - (unsigned int)anchor);
}

__device__ __forceinline__ int vdet_key_anchor(vdet_u64 key) {
    return (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
}

__device__ __forceinline__ float vdet_key_score(vdet_u64 key) {
    return __uint_as_float((unsigned int)(key >> 32));
}

/* Power of two >= n (1 for n <= 1): the padded length of the bitonic sort. */
__device__ __forceinline__ int vdet_pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* ---- 1. decode ------------------------------------------------------------------------- */

template <typename In>
__device__ __forceinline__ void vdet_decode_candidates(
    const In* __restrict__ raw, int nc, int n_anchors, float conf, int use_filter,
    const VdetClassMask& filter, unsigned int* __restrict__ counts, vdet_u64* __restrict__ keys,
    int* __restrict__ best_class) {
    __shared__ float s_score[VDET_DECODE_GROUPS][VDET_DECODE_ANCHORS];
    __shared__ int s_class[VDET_DECODE_GROUPS][VDET_DECODE_ANCHORS];
    __shared__ int s_nan[VDET_DECODE_GROUPS][VDET_DECODE_ANCHORS];
    const int lane = threadIdx.x;
    const int group = threadIdx.y;
    const int b = blockIdx.y;
    const int anchor = blockIdx.x * VDET_DECODE_ANCHORS + lane;
    float best = __int_as_float((int)0xff800000); /* -inf */
    int best_c = -1;
    int nan = 0;
    if (anchor < n_anchors) {
        const In* p = raw + ((long long)b * (4 + nc) + 4) * n_anchors + anchor;
#pragma unroll 4
        for (int c = group; c < nc; c += VDET_DECODE_GROUPS) {
            const float s = vdet_load(p + (long long)c * n_anchors);
            nan |= (s != s);
            /* Classes rise within a thread, so a strict > keeps the lowest id of a tie. */
            if (s > best) {
                best = s;
                best_c = c;
            }
        }
    }
    s_score[group][lane] = best;
    s_class[group][lane] = best_c;
    s_nan[group][lane] = nan;
    __syncthreads();
    if (group != 0) return;

    best = __int_as_float((int)0xff800000);
    best_c = -1;
    nan = 0;
    for (int g = 0; g < VDET_DECODE_GROUPS; ++g) {
        const float s = s_score[g][lane];
        const int c = s_class[g][lane];
        nan |= s_nan[g][lane];
        if (c >= 0 && (best_c < 0 || s > best || (s == best && c < best_c))) {
            best = s;
            best_c = c;
        }
    }
    bool pass = !nan && best_c >= 0 && best > conf;
    if (pass && use_filter) {
        pass = best_c < VDET_MAX_FILTER_CLASSES &&
               ((filter.words[best_c >> 5] >> (best_c & 31)) & 1u) != 0u;
    }
    /* One atomic per warp reserves the warp's slots. */
    const unsigned int ballot = __ballot_sync(0xffffffffu, pass);
    unsigned int base = 0;
    if (lane == 0 && ballot != 0u) base = atomicAdd(&counts[b], (unsigned int)__popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (pass) {
        const unsigned int pos = base + (unsigned int)__popc(ballot & vdet_lanemask_lt(lane));
        keys[(long long)b * n_anchors + pos] = vdet_make_key(best, anchor);
        best_class[(long long)b * n_anchors + anchor] = best_c;
    }
}

/* ---- 2. top-k ---------------------------------------------------------------------------- */

/* The first histogram's digit: scores are > conf >= 0, so their float bits are > conf's and
 * order like the scores. (conf, 1) is split into VDET_SELECT_BINS ranges of equal width in bits
 * (scores of 1 and above share the top one). The digit depends on the score alone and never
 * decreases as the key grows, so a key in a higher bucket is larger than every key in a lower
 * one: any such digit gives the same result, this one gives small buckets for scores in (0, 1]. */
__device__ __forceinline__ unsigned int vdet_score_base(float conf) {
    return conf > 0.0f ? __float_as_uint(conf) : 0u; /* -0 counts as 0 */
}

__device__ __forceinline__ int vdet_score_shift(unsigned int base) {
    const unsigned int one = 0x3F800000u; /* 1.0f */
    const unsigned int span = base + 1u < one ? one - base - 1u : 0u; /* the largest delta < 1 */
    const int bits = span != 0u ? 32 - __clz((int)span) : 0;
    return bits > VDET_SELECT_DIGIT_BITS ? bits - VDET_SELECT_DIGIT_BITS : 0;
}

__device__ __forceinline__ unsigned int vdet_score_digit(vdet_u64 key, unsigned int base,
                                                         int shift) {
    const unsigned int d = ((unsigned int)(key >> 32) - base) >> shift;
    return d < VDET_SELECT_BINS - 1u ? d : VDET_SELECT_BINS - 1u;
}

/* Appends the keys of the lanes that `take` to dst[*counter ...], one atomic per warp. */
__device__ __forceinline__ void vdet_append_key(vdet_u64* dst, unsigned int* counter, bool take,
                                                vdet_u64 key, int lane) {
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    unsigned int first = 0;
    if (lane == 0 && ballot != 0u) first = atomicAdd(counter, (unsigned int)__popc(ballot));
    first = __shfl_sync(0xffffffffu, first, 0);
    if (take) dst[first + (unsigned int)__popc(ballot & vdet_lanemask_lt(lane))] = key;
}

/* The same for VDET_SELECT_BATCH keys per lane, v[j] appended where bit j of `take` is set:
 * one atomic per warp for all of them. */
__device__ __forceinline__ void vdet_append_keys(vdet_u64* dst, unsigned int* counter,
                                                 unsigned int take, const vdet_u64* v, int lane) {
    unsigned int ballot[VDET_SELECT_BATCH];
    unsigned int total = 0;
#pragma unroll
    for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
        ballot[j] = __ballot_sync(0xffffffffu, (take >> j) & 1u);
        total += (unsigned int)__popc(ballot[j]);
    }
    if (total == 0u) return; /* the same for the whole warp */
    unsigned int at = 0;
    if (lane == 0) at = atomicAdd(counter, total);
    at = __shfl_sync(0xffffffffu, at, 0);
    const unsigned int before = vdet_lanemask_lt(lane);
#pragma unroll
    for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
        if ((take >> j) & 1u) dst[at + (unsigned int)__popc(ballot[j] & before)] = v[j];
        at += (unsigned int)__popc(ballot[j]);
    }
}

/* Adds one to hist[digit] for every lane whose digit is < bins; lanes with the same digit add
 * once (most keys share a few buckets). Every lane of the warp must call it. */
__device__ __forceinline__ void vdet_count_digit(unsigned int* hist, unsigned int digit,
                                                 unsigned int bins, int lane) {
    const unsigned int peers = __match_any_sync(0xffffffffu, digit);
    if (digit < bins && lane == __ffs(peers) - 1) {
        atomicAdd(&hist[digit], (unsigned int)__popc(peers));
    }
}

/* Over the whole block: the bucket of hist[0 .. VDET_SELECT_BINS) (highest bucket first) that
 * holds the remaining-th largest key, 1 <= remaining <= the total. out[0] = its digit,
 * out[1] = keys in higher buckets, out[2] = keys in it. Each thread sums VDET_SELECT_BINS /
 * blockDim.x consecutive buckets (blockDim.x a power of two, 32 .. 1024); warp_sums holds 32
 * words. Ends with a barrier, after which hist is no longer read. */
__device__ __forceinline__ void vdet_find_bucket(const unsigned int* hist, unsigned int remaining,
                                                 unsigned int* warp_sums, unsigned int* out,
                                                 int tid, int lane, int warp, int threads) {
    const int per = VDET_SELECT_BINS / threads;
    const int top = VDET_SELECT_BINS - 1 - per * tid;
    unsigned int sum = 0;
    for (int j = 0; j < per; ++j) sum += hist[top - j];
    unsigned int inclusive = sum;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned int before = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += before;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    unsigned int earlier = lane < warp ? warp_sums[lane] : 0u; /* the warps before this one */
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        earlier += __shfl_xor_sync(0xffffffffu, earlier, offset);
    }
    unsigned int above = earlier + inclusive - sum;
    if (above < remaining && remaining <= above + sum) { /* exactly one thread */
        for (int j = 0; j < per; ++j) {
            const unsigned int h = hist[top - j];
            if (above + h >= remaining) {
                out[0] = (unsigned int)(top - j);
                out[1] = above;
                out[2] = h;
                break;
            }
            above += h;
        }
    }
    __syncthreads();
}

/* Sorts a warp's 32 keys (one per lane) in descending order: lane 0 gets the largest. */
__device__ __forceinline__ vdet_u64 vdet_warp_sort_desc(vdet_u64 x, int lane) {
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const vdet_u64 y = __shfl_xor_sync(0xffffffffu, x, stride);
            /* The lower lane of a pair keeps the larger key where its run descends. */
            const bool keep_larger = ((lane & stride) == 0) == ((lane & size) == 0);
            if (keep_larger == (y > x)) x = y;
        }
    }
    return x;
}

/* Keys of run[0 .. n) (descending) that are > x, or >= x when or_equal. */
__device__ __forceinline__ int vdet_count_before(const vdet_u64* run, int n, vdet_u64 x,
                                                 bool or_equal) {
    int lo = 0;
    int hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        const vdet_u64 y = run[mid];
        if (y > x || (or_equal && y == x)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Sorts a[0 .. k) descending (k <= VDET_SORT_PER_THREAD * blockDim.x), using a[k .. pow2 >= k)
 * as zero padding (every key is > 0): runs of 32 sorted by one warp each in registers, then
 * pairs of sorted runs merged, each key moving to its rank in the merged run (its index in its
 * own run plus the keys of the other run before it, by binary search). Ends with a barrier. */
__device__ __forceinline__ void vdet_sort_keys_desc(vdet_u64* a, int k, int tid, int lane, int warp,
                                                    int threads) {
    const int padded = vdet_pow2_at_least(k);
    for (int first = warp * 32; first < padded; first += threads) {
        const int i = first + lane;
        vdet_u64 x = i < k ? a[i] : 0ull;
        x = vdet_warp_sort_desc(x, lane);
        if (i < padded) a[i] = x; /* shorter than a warp: the padding lanes sort last */
    }
    __syncthreads();
    for (int run = 32; run < padded; run <<= 1) {
        vdet_u64 key[VDET_SORT_PER_THREAD];
        int to[VDET_SORT_PER_THREAD];
#pragma unroll
        for (int q = 0; q < VDET_SORT_PER_THREAD; ++q) {
            const int i = tid + q * threads;
            to[q] = -1;
            key[q] = 0ull;
            if (i < padded) {
                const int pair = i & ~(2 * run - 1);
                const bool second = (i & run) != 0;
                key[q] = a[i];
                /* Ties (only the zero padding) go to the first run: a stable merge. */
                to[q] = pair + (i & (run - 1)) +
                        vdet_count_before(a + pair + (second ? 0 : run), run, key[q], second);
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < VDET_SORT_PER_THREAD; ++q) {
            if (to[q] >= 0) a[to[q]] = key[q];
        }
        __syncthreads();
    }
}

template <typename In>
__device__ __forceinline__ void vdet_select_topk(
    const In* __restrict__ raw, int nc, int n_anchors, int top_k, float conf, int stage_cap,
    const unsigned int* __restrict__ counts, const vdet_u64* __restrict__ keys,
    const int* __restrict__ best_class, int cand_cap, unsigned int* __restrict__ cand_count,
    VdetBox* __restrict__ cand_box, float* __restrict__ cand_score, int* __restrict__ cand_class,
    int* __restrict__ cand_anchor) {
    VDET_DYNAMIC_SMEM(smem);
    unsigned int* hist = reinterpret_cast<unsigned int*>(smem); /* VDET_SELECT_BINS */
    /* The same memory once the bucket is found: keys of the boundary bucket. */
    vdet_u64* boundary = reinterpret_cast<vdet_u64*>(smem);
    unsigned int* fine = hist + VDET_SELECT_BINS; /* 256 bins of the boundary's radix passes */
    vdet_u64* reduce = reinterpret_cast<vdet_u64*>(fine + 256); /* 64 words of block scratch */
    unsigned int* misc = reinterpret_cast<unsigned int*>(reduce + 64); /* 16 scalars */
    const int sel_cap = vdet_pow2_at_least(top_k);
    vdet_u64* sel = reinterpret_cast<vdet_u64*>(smem + VDET_SELECT_SMEM_HEADER);
    vdet_u64* stage = sel + sel_cap;
    enum { kSelected = 0, kAside = 1, kBucket = 2, kAbove = 3, kInBucket = 4, kDigit = 5,
           kLeft = 6, kInDigit = 7 };

    const int b = blockIdx.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int threads = blockDim.x;
    const int m = (int)counts[b];
    const int k = vdet_min(m, top_k);
    const vdet_u64* src = keys + (long long)b * n_anchors;
    const int step = VDET_SELECT_BATCH * threads;

    if (m <= top_k) {
        /* Every key is a candidate. */
        for (int first = 0; first < m; first += step) {
            vdet_u64 v[VDET_SELECT_BATCH];
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const int i = first + j * threads + tid;
                v[j] = i < m ? src[i] : 0ull;
            }
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const int i = first + j * threads + tid;
                if (i < m) sel[i] = v[j];
            }
        }
    } else {
        /* 1. Stage the keys (when they fit) and histogram their score digit. */
        const unsigned int base = vdet_score_base(conf);
        const int shift = vdet_score_shift(base);
        for (int i = tid; i < VDET_SELECT_BINS; i += threads) hist[i] = 0u;
        if (tid == 0) {
            misc[kSelected] = 0u;
            misc[kAside] = 0u;
        }
        __syncthreads();
        const bool staged = m <= stage_cap;
        for (int first = 0; first < m; first += step) {
            vdet_u64 v[VDET_SELECT_BATCH];
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const int i = first + j * threads + tid;
                v[j] = i < m ? src[i] : 0ull;
            }
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const int i = first + j * threads + tid;
                unsigned int digit = VDET_SELECT_BINS; /* none */
                if (i < m) {
                    if (staged) stage[i] = v[j];
                    digit = vdet_score_digit(v[j], base, shift);
                }
                vdet_count_digit(hist, digit, VDET_SELECT_BINS, lane);
            }
        }
        if (staged) src = stage;
        __syncthreads();

        /* 2. The bucket of the top_k-th largest key: `need` of its `in_bucket` keys are kept. */
        vdet_find_bucket(hist, (unsigned int)top_k, reinterpret_cast<unsigned int*>(reduce),
                         misc + kBucket, tid, lane, warp, threads);
        const unsigned int bucket = misc[kBucket];
        const unsigned int in_bucket = misc[kInBucket];
        const unsigned int need = (unsigned int)top_k - misc[kAbove];
        const bool whole = in_bucket == need;
        const bool buffered = in_bucket <= VDET_SELECT_BOUNDARY_CAP;
        /* The bucket's score bits are [low, next) (no end for the top bucket); no overflow:
         * base < 2^30 and VDET_SELECT_BINS << shift <= 2^30. */
        const unsigned int low = base + (bucket << shift);
        const unsigned int next = base + ((bucket + 1u) << shift);
        const bool top_bucket = bucket == VDET_SELECT_BINS - 1u;

        /* 3. Keys of higher buckets (and of the bucket itself when it is kept whole) are
         * selected; the bucket's keys are put aside (in the histogram's memory when they fit). */
        vdet_u64 any_bits = 0ull;  /* OR of the keys put aside */
        vdet_u64 all_bits = ~0ull; /* AND of them */
        for (int first = 0; first < m; first += step) {
            vdet_u64 v[VDET_SELECT_BATCH];
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const int i = first + j * threads + tid;
                v[j] = i < m ? src[i] : 0ull; /* 0: below every bucket */
            }
            unsigned int higher = 0u;
            unsigned int same = 0u;
#pragma unroll
            for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                const unsigned int score = (unsigned int)(v[j] >> 32);
                const bool above = !top_bucket && score >= next;
                higher |= (unsigned int)above << j;
                same |= (unsigned int)(!above && score >= low && score > base) << j;
            }
            if (whole) {
                vdet_append_keys(sel, &misc[kSelected], higher | same, v, lane);
            } else {
                vdet_append_keys(sel, &misc[kSelected], higher, v, lane);
                if (buffered) vdet_append_keys(boundary, &misc[kAside], same, v, lane);
#pragma unroll
                for (int j = 0; j < VDET_SELECT_BATCH; ++j) {
                    if ((same >> j) & 1u) {
                        any_bits |= v[j];
                        all_bits &= v[j];
                    }
                }
            }
        }

        if (!whole) {
            /* 4. Radix-select the `need` largest keys of the bucket (8-bit digits from its
             * highest differing bit down, skipping bits its keys all share, stopping as soon as
             * a digit's bucket is kept whole), from the keys put aside, or else from all keys
             * filtered by their score. */
            for (int offset = 16; offset > 0; offset >>= 1) {
                any_bits |= __shfl_xor_sync(0xffffffffu, any_bits, offset);
                all_bits &= __shfl_xor_sync(0xffffffffu, all_bits, offset);
            }
            if (lane == 0) {
                reduce[warp] = any_bits;
                reduce[32 + warp] = all_bits;
            }
            __syncthreads();
            any_bits = 0ull;
            all_bits = ~0ull;
            for (int w = 0; w < (threads >> 5); ++w) {
                any_bits |= reduce[w];
                all_bits &= reduce[32 + w];
            }
            /* The bucket holds >= 2 keys (need < in_bucket), all distinct: some bit differs. */
            const vdet_u64 differ = any_bits ^ all_bits;
            const int top = 63 - __clzll((long long)differ);
            vdet_u64 prefix_mask = top == 63 ? 0ull : (~0ull << (top + 1));
            vdet_u64 prefix = all_bits & prefix_mask;
            unsigned int remaining = need;
            const vdet_u64* pool = buffered ? boundary : src;
            const int pool_n = buffered ? (int)in_bucket : m;
            /* The last digit may overlap bits already fixed, which the bucket's keys share. */
            for (int at = top - 7;;) {
                if (at < 0) at = 0;
                for (int i = tid; i < 256; i += threads) fine[i] = 0u;
                __syncthreads();
                for (int first = 0; first < pool_n; first += threads) {
                    const int i = first + tid;
                    unsigned int digit = 256u; /* not in this pass's bucket */
                    if (i < pool_n) {
                        const vdet_u64 key = pool[i];
                        const unsigned int score = (unsigned int)(key >> 32);
                        if ((key & prefix_mask) == prefix &&
                            (buffered || (score >= low && (top_bucket || score < next)))) {
                            digit = (unsigned int)(key >> at) & 255u;
                        }
                    }
                    vdet_count_digit(fine, digit, 256u, lane);
                }
                __syncthreads();
                if (warp == 0) {
                    /* Lane l owns digits 255 - 8l down to 248 - 8l; scan from the top digit. */
                    unsigned int lane_sum = 0;
#pragma unroll
                    for (int t = 0; t < 8; ++t) lane_sum += fine[255 - 8 * lane - t];
                    unsigned int inclusive = lane_sum;
#pragma unroll
                    for (int offset = 1; offset < 32; offset <<= 1) {
                        const unsigned int before = __shfl_up_sync(0xffffffffu, inclusive, offset);
                        if (lane >= offset) inclusive += before;
                    }
                    const unsigned int reached =
                        __ballot_sync(0xffffffffu, inclusive >= remaining);
                    if (lane == __ffs(reached) - 1) {
                        unsigned int above = inclusive - lane_sum;
                        for (int t = 0; t < 8; ++t) {
                            const int d = 255 - 8 * lane - t;
                            const unsigned int h = fine[d];
                            if (above + h >= remaining) {
                                misc[kDigit] = (unsigned int)d;
                                misc[kLeft] = remaining - above;
                                misc[kInDigit] = h;
                                break;
                            }
                            above += h;
                        }
                    }
                }
                __syncthreads();
                /* misc is rewritten only after two more barriers, so every thread reads it. */
                prefix |= (vdet_u64)misc[kDigit] << at;
                prefix_mask |= 255ull << at;
                remaining = misc[kLeft];
                if (misc[kInDigit] == remaining || at == 0) break;
                /* The next digit starts at the next bit on which the bucket's keys differ (some
                 * does: >= 2 distinct keys are left); the bits skipped are the same in all. */
                const vdet_u64 below = differ & ((1ull << at) - 1ull);
                const int next_top = below != 0ull ? 63 - __clzll((long long)below) : at - 1;
                const vdet_u64 skipped = ((1ull << at) - 1ull) & ~((2ull << next_top) - 1ull);
                prefix |= all_bits & skipped;
                prefix_mask |= skipped;
                at = next_top - 7;
            }
            /* Exactly `need` keys of the bucket are >= prefix (bits below it are zero). */
            for (int first = 0; first < pool_n; first += threads) {
                const int i = first + tid;
                vdet_u64 key = 0ull;
                bool take = false;
                if (i < pool_n) {
                    key = pool[i];
                    const unsigned int score = (unsigned int)(key >> 32);
                    take = key >= prefix &&
                           (buffered || (score >= low && (top_bucket || score < next)));
                }
                vdet_append_key(sel, &misc[kSelected], take, key, lane);
            }
        }
    }
    __syncthreads();

    /* 5. The k keys in descending order; they are unique, so the order is total. */
    vdet_sort_keys_desc(sel, k, tid, lane, warp, threads);

    const In* head = raw + (long long)b * (4 + nc) * n_anchors;
    for (int t = tid; t < k; t += threads) {
        const vdet_u64 key = sel[t];
        const int anchor = vdet_key_anchor(key);
        const float cx = vdet_load(head + anchor);
        const float cy = vdet_load(head + n_anchors + anchor);
        const float half_w = __fdiv_rn(vdet_load(head + 2LL * n_anchors + anchor), 2.0f);
        const float half_h = __fdiv_rn(vdet_load(head + 3LL * n_anchors + anchor), 2.0f);
        VdetBox box;
        box.x1 = __fsub_rn(cx, half_w);
        box.y1 = __fsub_rn(cy, half_h);
        box.x2 = __fadd_rn(cx, half_w);
        box.y2 = __fadd_rn(cy, half_h);
        const long long o = (long long)b * cand_cap + t;
        cand_box[o] = box;
        cand_score[o] = vdet_key_score(key);
        cand_class[o] = best_class[(long long)b * n_anchors + anchor];
        cand_anchor[o] = anchor;
    }
    if (tid == 0) cand_count[b] = (unsigned int)k;
}

/* ---- 3. suppression bitmask -------------------------------------------------------------- */

/* IoU(a, b) > threshold in float32, in the reference's order of operations. */
__device__ __forceinline__ bool vdet_iou_above(const VdetBox& a, const VdetBox& b, float threshold) {
    const float iw = fmaxf(__fsub_rn(fminf(a.x2, b.x2), fmaxf(a.x1, b.x1)), 0.0f);
    const float ih = fmaxf(__fsub_rn(fminf(a.y2, b.y2), fmaxf(a.y1, b.y1)), 0.0f);
    const float inter = __fmul_rn(iw, ih);
    const float area_a = __fmul_rn(__fsub_rn(a.x2, a.x1), __fsub_rn(a.y2, a.y1));
    const float area_b = __fmul_rn(__fsub_rn(b.x2, b.x1), __fsub_rn(b.y2, b.y1));
    const float uni = __fsub_rn(__fadd_rn(area_a, area_b), inter);
    const float iou = uni > 0.0f ? __fdiv_rn(inter, uni) : 0.0f;
    return iou > threshold;
}

/* blockDim.x = 64 * L threads, L in {1, 2, 4, 8, 16}: L consecutive threads share a row,
 * thread q of a row taking columns q, q + L, ... (64 threads work; 256 keep more of the SM busy,
 * each thread computing 16 IoUs instead of 64). */
__device__ __forceinline__ void vdet_nms_mask_tile(
    const unsigned int* __restrict__ cand_count, const VdetBox* __restrict__ cand_box,
    const int* __restrict__ cand_class, int cand_cap, int words, float iou_threshold,
    int agnostic, vdet_u64* __restrict__ mask) {
    __shared__ VdetBox s_box[64];
    __shared__ int s_class[64];
    const int col_block = blockIdx.x;
    const int row_block = blockIdx.y;
    const int b = blockIdx.z;
    const int tid = threadIdx.x;
    const int per_row = blockDim.x >> 6;
    const int r = tid / per_row;
    const int q = tid - r * per_row;
    const int n = (int)cand_count[b];
    /* The sweep reads only tiles on or right of the diagonal, inside the candidates. */
    if (col_block < row_block || row_block * 64 >= n || col_block * 64 >= n) return;
    const long long first = (long long)b * cand_cap;
    const int col = col_block * 64 + tid;
    if (tid < 64 && col < n) {
        s_box[tid] = cand_box[first + col];
        s_class[tid] = cand_class[first + col];
    }
    __syncthreads();
    const int row = row_block * 64 + r;
    vdet_u64 bits = 0;
    if (row < n) {
        const VdetBox me = cand_box[first + row];
        const int my_class = cand_class[first + row];
        const int cols = vdet_min(64, n - col_block * 64);
        const int skip = col_block == row_block ? r : -1; /* only columns j > r on the diagonal */
        for (int j = q; j < cols; j += per_row) {
            if (j > skip && (agnostic || s_class[j] == my_class) &&
                vdet_iou_above(me, s_box[j], iou_threshold)) {
                bits |= 1ull << j;
            }
        }
    }
    /* The threads of a row are consecutive lanes of one warp: OR their columns together. */
    for (int offset = 1; offset < per_row; offset <<= 1) {
        bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
    }
    if (row < n && q == 0) mask[(first + row) * words + col_block] = bits;
}

/* ---- 4. greedy sweep ------------------------------------------------------------------- */

/* Dynamic shared memory this block was launched with. */
__device__ __forceinline__ unsigned int vdet_dynamic_smem_bytes() {
#ifdef VDET_EMULATION
    return emu::dynamic_smem_bytes();
#else
    unsigned int bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
#endif
}

/* Mask words of the upper triangle of row tiles 0 .. words - 1 (64 rows, words c .. words - 1
 * for tile c): what vdet_nms_scan keeps in shared memory when it is given room for it. */
__device__ __forceinline__ long long vdet_triangle_words(int words) {
    return 64LL * words * (words + 1) / 2;
}

/* Where row tile c starts in the preloaded triangle of `used` tiles. */
__device__ __forceinline__ long long vdet_triangle_offset(int c, int used) {
    return 64LL * ((long long)c * used - (long long)c * (c - 1) / 2);
}

/* Rows 64c .. 64c + 63 (zero past the candidates), words c .. used - 1, into
 * dst[r * row_stride + (j - col_base)]. */
__device__ __forceinline__ void vdet_load_row_tile(
    const vdet_u64* __restrict__ mask, int n, int words, int used, int c, vdet_u64* dst,
    int row_stride, int col_base, int worker, int workers) {
    const int span = used - c;
    const int rows = vdet_min(64, n - c * 64);
    for (int i = worker; i < 64 * span; i += workers) {
        const int r = i / span;
        const int j = c + i % span;
        dst[r * row_stride + (j - col_base)] =
            r < rows ? mask[(long long)(c * 64 + r) * words + j] : 0ull;
    }
}

/* The whole triangle of `used` row tiles into dst, laid out as vdet_triangle_offset says (zero
 * past the candidates). A power-of-two group of workers per row (at least `used` of them),
 * worker jj of a row loading its word c + jj; VDET_SCAN_BATCH rows in flight per worker
 * (loading tile after tile would wait for the memory once per tile). */
__device__ __forceinline__ void vdet_preload_triangle(const vdet_u64* __restrict__ mask, int n,
                                                      int words, int used, vdet_u64* dst,
                                                      int worker, int workers) {
    int log_per_row = 0;
    while ((1 << log_per_row) < used) ++log_per_row;
    const int jj = worker & ((1 << log_per_row) - 1);
    const int rows_at_once = workers >> log_per_row;
    const int rows = 64 * used;
    for (int first = worker >> log_per_row; first < rows;
         first += VDET_SCAN_BATCH * rows_at_once) {
        vdet_u64 v[VDET_SCAN_BATCH];
        int at[VDET_SCAN_BATCH];
#pragma unroll
        for (int q = 0; q < VDET_SCAN_BATCH; ++q) {
            const int row = first + q * rows_at_once;
            const int c = row >> 6;
            const int span = used - c;
            at[q] = -1;
            v[q] = 0ull;
            if (row < rows && jj < span) {
                /* vdet_triangle_offset(c, used) in 32 bits: rows * words <= 4096 * 64 */
                at[q] = 32 * c * (2 * used + 1 - c) + (row & 63) * span + jj;
                if (row < n) v[q] = mask[row * words + c + jj];
            }
        }
#pragma unroll
        for (int q = 0; q < VDET_SCAN_BATCH; ++q) {
            if (at[q] >= 0) dst[at[q]] = v[q];
        }
    }
}

/* Warp 0 decides row tile c: which of its open candidates greedy NMS keeps, appended to
 * keep[] in order (up to max_keep). Only candidates that overlap a later one of the tile
 * (a non-zero diagonal word) need the sequential step; the others are kept iff still open. */
__device__ __forceinline__ void vdet_resolve_tile(
    const vdet_u64* tile, int stride, int base, int c, int n, const vdet_u64* removed,
    int* keep, int max_keep, int* s_kept, vdet_u64* s_kept_bits, int lane) {
    const int rows = vdet_min(64, n - c * 64);
    const vdet_u64 valid = rows == 64 ? ~0ull : ((1ull << rows) - 1ull);
    const int diagonal = c - base;
    const vdet_u64 d0 = tile[lane * stride + diagonal];
    const vdet_u64 d1 = tile[(lane + 32) * stride + diagonal];
    const vdet_u64 overlapping = (vdet_u64)__ballot_sync(0xffffffffu, d0 != 0ull) |
                                 ((vdet_u64)__ballot_sync(0xffffffffu, d1 != 0ull) << 32);
    vdet_u64 open = 0ull;
    int before = 0;
    if (lane == 0) {
        before = *s_kept;
        open = valid & ~removed[c];
        vdet_u64 work = open & overlapping;
        while (work != 0ull) {
            const int bit = __ffsll((long long)work) - 1;
            open &= ~tile[bit * stride + diagonal]; /* only bits above `bit` */
            work = bit == 63 ? 0ull : (open & overlapping & (~0ull << (bit + 1)));
        }
    }
    open = __shfl_sync(0xffffffffu, open, 0);
    before = __shfl_sync(0xffffffffu, before, 0);
    const int at0 = before + __popcll(open & ((1ull << lane) - 1ull));
    const int at1 = before + __popcll(open & ((1ull << (lane + 32)) - 1ull));
    const bool take0 = ((open >> lane) & 1ull) != 0ull && at0 < max_keep;
    const bool take1 = ((open >> (lane + 32)) & 1ull) != 0ull && at1 < max_keep;
    if (take0) keep[at0] = c * 64 + lane;
    if (take1) keep[at1] = c * 64 + lane + 32;
    const vdet_u64 taken = (vdet_u64)__ballot_sync(0xffffffffu, take0) |
                           ((vdet_u64)__ballot_sync(0xffffffffu, take1) << 32);
    if (lane == 0) {
        *s_kept_bits = taken;
        *s_kept = before + __popcll(taken);
    }
}

/* With dynamic shared memory of at least VDET_SCAN_SMEM_HEADER + 8 * vdet_triangle_words(words)
 * + 4 * max_keep bytes, the whole mask triangle is loaded at once; otherwise (at least
 * VDET_SCAN_SMEM_HEADER + 2 * 64 * 8 * words + 4 * max_keep) one row tile at a time, the next
 * prefetched by warps 1.. while warp 0 resolves the current one. */
__device__ __forceinline__ void vdet_nms_sweep(
    const unsigned int* __restrict__ cand_count, const VdetBox* __restrict__ cand_box,
    const float* __restrict__ cand_score, const int* __restrict__ cand_class,
    const int* __restrict__ cand_anchor, int cand_cap, int words,
    const vdet_u64* __restrict__ mask, int max_det, int max_keep, float* __restrict__ out,
    int* __restrict__ out_count, int* __restrict__ out_anchor) {
    VDET_DYNAMIC_SMEM(smem);
    vdet_u64* removed = reinterpret_cast<vdet_u64*>(smem);
    vdet_u64* tiles = reinterpret_cast<vdet_u64*>(smem + VDET_SCAN_SMEM_HEADER);
    const long long triangle = vdet_triangle_words(words);
    const bool preload = (long long)vdet_dynamic_smem_bytes() >=
                         VDET_SCAN_SMEM_HEADER + 8 * triangle + 4LL * max_keep;
    int* keep = reinterpret_cast<int*>(tiles + (preload ? triangle : 2LL * 64 * words));
    __shared__ vdet_u64 s_kept_bits;
    __shared__ int s_kept;

    const int b = blockIdx.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warps = blockDim.x >> 5;
    const int n = (int)cand_count[b];
    const int used = (n + 63) >> 6;
    const vdet_u64* m = mask + (long long)b * cand_cap * words;

    for (int j = tid; j < used; j += blockDim.x) removed[j] = 0ull;
    if (tid == 0) s_kept = 0;
    if (preload) {
        vdet_preload_triangle(m, n, words, used, tiles, tid, blockDim.x);
    } else {
        vdet_load_row_tile(m, n, words, used, 0, tiles, words, 0, tid, blockDim.x);
    }
    __syncthreads();

    for (int c = 0; c < used; ++c) {
        const vdet_u64* tile = preload ? tiles + vdet_triangle_offset(c, used)
                                       : tiles + (c & 1) * 64 * words;
        const int stride = preload ? used - c : words;
        const int base = preload ? c : 0;
        if (warp > 0) {
            /* Prefetch the next row tile while warp 0 resolves this one. */
            if (!preload && c + 1 < used) {
                vdet_load_row_tile(m, n, words, used, c + 1,
                                   tiles + ((c + 1) & 1) * 64 * words, words, 0, tid - 32,
                                   blockDim.x - 32);
            }
        } else {
            vdet_resolve_tile(tile, stride, base, c, n, removed, keep, max_keep, &s_kept,
                              &s_kept_bits, lane);
        }
        __syncthreads();
        if (s_kept >= max_keep) break;
        /* Kept rows of this tile remove their overlaps in the later words: warp w ORs rows
         * w, w + warps, ... (lanes along a row: no bank conflicts), then each lane ORs its word
         * into `removed` (OR in any order gives the same bits). */
        const vdet_u64 kept_bits = s_kept_bits;
        for (int j = c + 1 + lane; j < used; j += 32) {
            vdet_u64 v = 0ull;
            for (int r = warp; r < 64; r += warps) {
                if ((kept_bits >> r) & 1ull) v |= tile[r * stride + (j - base)];
            }
            if (v != 0ull) { /* two 32-bit ORs: shared memory has no native 64-bit one */
                unsigned int* word = reinterpret_cast<unsigned int*>(&removed[j]);
                atomicOr(word, (unsigned int)v); /* little-endian: the low half first */
                atomicOr(word + 1, (unsigned int)(v >> 32));
            }
        }
        __syncthreads();
    }

    const int kept = s_kept;
    for (int t = tid; t < max_det; t += blockDim.x) {
        float* o = out + ((long long)b * max_det + t) * 6;
        int anchor = -1;
        if (t < kept) {
            const long long i = (long long)b * cand_cap + keep[t];
            const VdetBox box = cand_box[i];
            o[0] = box.x1;
            o[1] = box.y1;
            o[2] = box.x2;
            o[3] = box.y2;
            o[4] = cand_score[i];
            o[5] = (float)cand_class[i];
            anchor = cand_anchor[i];
        } else {
            o[0] = o[1] = o[2] = o[3] = o[4] = o[5] = 0.0f;
        }
        if (out_anchor != 0) out_anchor[(long long)b * max_det + t] = anchor;
    }
    if (tid == 0) out_count[b] = kept;
}

#endif /* VDET_DECODE_NMS_CUH */
