// CPU emulation of the CUDA execution model, for running the vdet kernels in tests without a GPU.
//
// Force-included (g++ -include emu.h) before service/vdet/cuda/kernels/*.cu. Each CUDA thread of a block
// is a ucontext fiber on one OS thread; __syncthreads and every warp intrinsic are barriers at
// which the fiber yields. Between barriers the fibers of a block run one after another in an
// order shuffled per round (seeded), so a read of shared memory that a missing barrier leaves
// unordered shows up as a wrong or run-dependent result. Blocks run one at a time, in a
// shuffled order too, so results that depend on block order show up as well.
//
// Checked, and reported as launch errors: a barrier that can never complete (deadlock), a warp
// intrinsic whose mask is not the full warp or that not all 32 lanes reach, block shapes that
// are not whole warps. Not emulated: memory spaces (device pointers are host pointers),
// timing, occupancy, atomics across blocks running at the same time.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define VDET_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)

struct dim3 {
    unsigned int x, y, z;
};

namespace emu {

constexpr size_t kStackBytes = 256 * 1024;

struct Thread {
    ucontext_t ctx;
    dim3 idx;
    int linear;
    bool done;
};

struct Warp {
    int live;
    int arrived;
    int participants;
    unsigned long generation;
    uint64_t slots[32];
};

struct Block {
    dim3 block_idx, block_dim, grid_dim;
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    int live;
    int arrived;
    unsigned long generation;
    std::vector<unsigned char> dynamic_smem;
    unsigned int dynamic_smem_bytes;  // as launched (%dynamic_smem_size)
};

inline Thread* g_thread = nullptr;
inline Block* g_block = nullptr;
inline ucontext_t g_scheduler;
inline std::string g_error;
inline unsigned long g_progress = 0;
inline std::function<void()> g_body;
inline std::vector<std::vector<char>> g_stacks;

inline void yield() { swapcontext(&g_thread->ctx, &g_scheduler); }

[[noreturn]] inline void fail(const std::string& message) {
    if (g_error.empty()) {
        g_error = message + " (block " + std::to_string(g_block->block_idx.x) + "," +
                  std::to_string(g_block->block_idx.y) + "," +
                  std::to_string(g_block->block_idx.z) + ", thread " +
                  std::to_string(g_thread->linear) + ")";
    }
    for (;;) yield();  // the scheduler abandons the launch
}

inline void sync_block() {
    Block& b = *g_block;
    const unsigned long mine = b.generation;
    ++g_progress;
    if (++b.arrived == b.live) {
        b.arrived = 0;
        ++b.generation;
        return;
    }
    while (b.generation == mine) yield();
}

inline unsigned int dynamic_smem_bytes() { return g_block->dynamic_smem_bytes; }

inline Warp& my_warp() { return g_block->warps[g_thread->linear >> 5]; }
inline int lane() { return g_thread->linear & 31; }

inline void sync_warp(unsigned int mask) {
    if (mask != 0xffffffffu) fail("warp intrinsic with a partial mask (not emulated)");
    Warp& w = my_warp();
    const unsigned long mine = w.generation;
    ++g_progress;
    if (++w.arrived == w.live) {
        w.participants = w.arrived;
        w.arrived = 0;
        ++w.generation;
    } else {
        while (w.generation == mine) yield();
    }
    if (w.participants != 32) fail("warp intrinsic reached by fewer than 32 lanes");
}

// Every lane contributes one 64-bit value; every lane gets all 32.
inline void exchange(unsigned int mask, uint64_t mine, uint64_t* all) {
    Warp& w = my_warp();
    w.slots[lane()] = mine;
    sync_warp(mask);
    memcpy(all, w.slots, sizeof(w.slots));
    sync_warp(mask);  // nobody overwrites the slots before every lane has read them
}

template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "at most 64-bit values");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <typename T>
inline T from_bits(uint64_t bits) {
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
}

template <typename T>
inline T shuffle_from(unsigned int mask, T v, int source) {
    uint64_t all[32];
    exchange(mask, to_bits(v), all);
    return from_bits<T>(all[source & 31]);
}

inline unsigned short float_to_half_bits(float f) {
    const _Float16 h = (_Float16)f;
    unsigned short bits;
    memcpy(&bits, &h, 2);
    return bits;
}

inline float half_bits_to_float(unsigned short bits) {
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}

inline void fiber_main() {
    g_body();
    Thread& t = *g_thread;
    Block& b = *g_block;
    t.done = true;
    ++g_progress;
    // An exited thread no longer takes part in barriers (as on the GPU).
    --b.live;
    if (b.arrived > 0 && b.arrived == b.live) {
        b.arrived = 0;
        ++b.generation;
    }
    Warp& w = my_warp();
    --w.live;
    if (w.arrived > 0 && w.arrived == w.live) {
        w.participants = w.arrived;
        w.arrived = 0;
        ++w.generation;
    }
    swapcontext(&t.ctx, &g_scheduler);
}

// Runs one block to completion; returns false with g_error set on a deadlock or misuse.
inline bool run_block(Block& b, std::mt19937& rng, bool shuffle) {
    const int n = (int)b.threads.size();
    if ((int)g_stacks.size() < n) g_stacks.resize(n);
    for (int i = 0; i < n; ++i) {
        if (g_stacks[i].empty()) g_stacks[i].resize(kStackBytes);
        Thread& t = b.threads[i];
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = g_stacks[i].data();
        t.ctx.uc_stack.ss_size = kStackBytes;
        t.ctx.uc_link = nullptr;
        makecontext(&t.ctx, fiber_main, 0);
    }
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    int remaining = n;
    while (remaining > 0) {
        if (shuffle) std::shuffle(order.begin(), order.end(), rng);
        const unsigned long before = g_progress;
        for (int i : order) {
            Thread& t = b.threads[i];
            if (t.done) continue;
            g_thread = &t;
            swapcontext(&g_scheduler, &t.ctx);
            if (!g_error.empty()) return false;
            if (t.done) --remaining;
        }
        if (remaining > 0 && g_progress == before) {
            g_error = "deadlock: threads wait at barriers that can never complete (block " +
                      std::to_string(b.block_idx.x) + "," + std::to_string(b.block_idx.y) + "," +
                      std::to_string(b.block_idx.z) + ")";
            return false;
        }
    }
    return true;
}

}  // namespace emu

#define threadIdx (emu::g_thread->idx)
#define blockIdx (emu::g_block->block_idx)
#define blockDim (emu::g_block->block_dim)
#define gridDim (emu::g_block->grid_dim)
#define VDET_DYNAMIC_SMEM(name) unsigned char* name = emu::g_block->dynamic_smem.data()

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) { emu::sync_warp(mask); }

inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
    uint64_t all[32];
    emu::exchange(mask, predicate ? 1u : 0u, all);
    unsigned int bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (all[i] ? 1u : 0u) << i;
    return bits;
}

template <typename T>
inline unsigned int __match_any_sync(unsigned int mask, T value) {
    uint64_t all[32];
    emu::exchange(mask, emu::to_bits(value), all);
    const uint64_t mine = all[emu::lane()];
    unsigned int bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (all[i] == mine ? 1u : 0u) << i;
    return bits;
}

template <typename T>
inline T __shfl_sync(unsigned int mask, T v, int source) {
    return emu::shuffle_from(mask, v, source);
}

template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    return emu::shuffle_from(mask, v, emu::lane() ^ lane_mask);
}

template <typename T>
inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta) {
    const int source = emu::lane() - (int)delta;
    uint64_t all[32];
    emu::exchange(mask, emu::to_bits(v), all);
    return source < 0 ? v : emu::from_bits<T>(all[source]);
}

template <typename T>
inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta) {
    const int source = emu::lane() + (int)delta;
    uint64_t all[32];
    emu::exchange(mask, emu::to_bits(v), all);
    return source > 31 ? v : emu::from_bits<T>(all[source]);
}

// Fibers switch only at barriers, so plain read-modify-write is atomic here.
template <typename T>
inline T atomicAdd(T* address, T value) {
    const T old = *address;
    *address = old + value;
    return old;
}

template <typename T>
inline T atomicOr(T* address, T value) {
    const T old = *address;
    *address = old | value;
    return old;
}

inline int __popc(unsigned int v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffs(unsigned int v) { return __builtin_ffs((int)v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned int)v); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }

inline unsigned int __float_as_uint(float f) { return emu::from_bits<unsigned int>(emu::to_bits(f)); }
inline float __uint_as_float(unsigned int u) { return emu::from_bits<float>(emu::to_bits(u)); }
inline float __int_as_float(int i) { return emu::from_bits<float>(emu::to_bits(i)); }
inline int __float_as_int(float f) { return emu::from_bits<int>(emu::to_bits(f)); }

// Compiled with -ffp-contract=off and SSE arithmetic: each of these rounds once, like the GPU's.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

inline int emu_saturate_int(float v) {
    if (v != v) return 0;
    if (v >= 2147483648.0f) return 2147483647;
    if (v < -2147483648.0f) return (-2147483647 - 1);
    return (int)v;
}
inline int __float2int_rn(float v) { return emu_saturate_int(nearbyintf(v)); }
inline int __float2int_rd(float v) { return emu_saturate_int(floorf(v)); }
