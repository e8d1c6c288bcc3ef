// The vdet kernels compiled for the CPU emulator (emu.h), behind one C entry point that takes
// the same arguments as cuLaunchKernel: a kernel name, grid, block, dynamic shared memory and an
// array of pointers to the kernel's parameters. Built by tests/support/kernels/emulator.py.
#include "emu.h"

#include <map>
#include <utility>

#include "decode_nms.cu"
#include "layers.cu"
#include "preprocess.cu"

namespace {

using Entry = std::function<void(void**)>;

template <typename... A, size_t... I>
void invoke(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}

template <typename... A>
Entry entry(void (*kernel)(A...)) {
    return [kernel](void** params) { invoke(kernel, params, std::index_sequence_for<A...>{}); };
}

const std::map<std::string, Entry>& registry() {
    static const std::map<std::string, Entry> kernels = {
        {"vdet_letterbox_bgr_f32", entry(vdet_letterbox_bgr_f32)},
        {"vdet_letterbox_bgr_f16", entry(vdet_letterbox_bgr_f16)},
        {"vdet_letterbox_nv12_f32", entry(vdet_letterbox_nv12_f32)},
        {"vdet_letterbox_nv12_f16", entry(vdet_letterbox_nv12_f16)},
        {"vdet_letterbox_p016_f32", entry(vdet_letterbox_p016_f32)},
        {"vdet_letterbox_p016_f16", entry(vdet_letterbox_p016_f16)},
        {"vdet_decode_candidates_f32", entry(vdet_decode_candidates_f32)},
        {"vdet_decode_candidates_f16", entry(vdet_decode_candidates_f16)},
        {"vdet_select_topk_f32", entry(vdet_select_topk_f32)},
        {"vdet_select_topk_f16", entry(vdet_select_topk_f16)},
        {"vdet_nms_mask", entry(vdet_nms_mask)},
        {"vdet_nms_scan", entry(vdet_nms_scan)},
        {"vdet_layer_bias_silu_f16", entry(vdet_layer_bias_silu_f16)},
        {"vdet_layer_max_pool_nhwc_f16", entry(vdet_layer_max_pool_nhwc_f16)},
    };
    return kernels;
}

int report(char* error, int error_bytes, const std::string& message) {
    if (error_bytes > 0) {
        strncpy(error, message.c_str(), (size_t)error_bytes - 1);
        error[error_bytes - 1] = '\0';
    }
    return 1;
}

}  // namespace

// Returns 0, or 1 with a message in `error`. `seed` 0 runs blocks and threads in order.
extern "C" int emu_launch(const char* name, unsigned int gx, unsigned int gy, unsigned int gz,
                          unsigned int bx, unsigned int by, unsigned int bz,
                          unsigned int shared_bytes, void** params, unsigned int seed,
                          char* error, int error_bytes) {
    const auto found = registry().find(name);
    if (found == registry().end()) return report(error, error_bytes, std::string("no kernel ") + name);
    const unsigned int threads = bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || threads > 1024) {
        return report(error, error_bytes, "invalid launch configuration");
    }
    if (threads % 32 != 0) return report(error, error_bytes, "block is not whole warps");
    const Entry& kernel = found->second;
    emu::g_error.clear();
    emu::g_body = [&kernel, params]() { kernel(params); };

    std::vector<dim3> blocks;
    for (unsigned int z = 0; z < gz; ++z)
        for (unsigned int y = 0; y < gy; ++y)
            for (unsigned int x = 0; x < gx; ++x) blocks.push_back({x, y, z});
    std::mt19937 rng(seed);
    if (seed != 0) std::shuffle(blocks.begin(), blocks.end(), rng);

    emu::Block block;
    block.grid_dim = {gx, gy, gz};
    block.block_dim = {bx, by, bz};
    for (const dim3& index : blocks) {
        block.block_idx = index;
        block.threads.assign(threads, emu::Thread{});
        for (unsigned int i = 0; i < threads; ++i) {
            emu::Thread& t = block.threads[i];
            t.linear = (int)i;
            t.idx = {i % bx, (i / bx) % by, i / (bx * by)};
            t.done = false;
        }
        block.warps.assign(threads / 32, emu::Warp{});
        for (emu::Warp& w : block.warps) w.live = 32;
        block.live = (int)threads;
        block.arrived = 0;
        block.generation = 0;
        // Garbage, not zeros, in shared memory: a read before a write shows up.
        block.dynamic_smem.assign(shared_bytes + 16, (unsigned char)0xA5);
        block.dynamic_smem_bytes = shared_bytes;
        emu::g_block = &block;
        if (!emu::run_block(block, rng, seed != 0)) return report(error, error_bytes, emu::g_error);
    }
    return 0;
}
