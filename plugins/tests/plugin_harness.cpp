/* A test driver for libvdet_plugins.so that needs TensorRT's headers but not TensorRT.
 *
 * What it exercises, through the library's own entry point getCreators() and the IPluginV3
 * interfaces only (what TensorRT itself would call):
 *   - the creator: name, version, namespace, the fields it lists;
 *   - createPlugin from a PluginFieldCollection, in both phases, and its refusal of bad fields;
 *   - getOutputDataTypes, getOutputShapes (dynamic and fixed batch), supportsFormatCombination,
 *     getNbOutputs, getWorkspaceSize, configurePlugin, onShapeChange;
 *   - getFieldsToSerialize -> createPlugin (what deserializing an engine does), and
 *     attachToContext (a clone per execution context);
 *   - enqueue on a hand-made raw head with a hand-computed answer (class-aware and agnostic,
 *     float32 and float16 input, an image without detections);
 *   - with --raw, enqueue on a raw head from a file, writing the outputs for a comparison with
 *     the CPU reference (plugins/tests/plugin_harness_check.py,
 *     tests/tensorrt/test_tensorrt_plugin_emulated.py, tests/tensorrt/), optionally with
 *     the workspace sized for a larger profile batch (--max-batch) and timed (--time).
 * getOutputShapes needs an IExprBuilder, which only TensorRT's builder makes; the harness passes
 * ShapeExprBuilder below, a minimal stand-in (constants and opaque symbols) that is enough to
 * see which expression lands in which output dimension. Nothing of TensorRT's parser, builder
 * or runtime runs here.
 *
 * One source, two builds, the same checks:
 *   - for a GPU (plugins/CMakeLists.txt, or nvcc + g++ directly as bench/gpu/run_plugin_device.sh
 *     does): device buffers, a CUDA stream, enqueue timed with CUDA events;
 *   - with -DVDET_LAUNCH_EMULATION the kernels run in the CPU emulator of tests/support/kernels/emu,
 *     the buffers are host memory and --time measures host time
 *     (tests/tensorrt/test_tensorrt_plugin_emulated.py).
 * Neither build links libnvinfer: everything of TensorRT the plugin and the harness use is
 * inline in its headers (interfaces, PluginField, InterfaceInfo).
 *
 *   vdet_plugin_harness                          self-checks; exit 0 when all pass
 *   vdet_plugin_harness --raw in.f32 --shape B,R,N [--half] [--score S] [--iou I] [--top-k K]
 *                       [--max-det M] [--agnostic] [--max-batch MB] [--time N --timing t.json]
 *                       --out dets.f32 --count count.i32
 * --time N: after the checked enqueue, 3 warm-up enqueues, N enqueues timed one by one (each
 * synchronized) and N back to back; then the outputs are read again and must equal the first
 * ones bit for bit (a stale count or workspace state would show here).
 */
#include <NvInferRuntime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#ifndef VDET_LAUNCH_EMULATION
#include <cuda_runtime_api.h>
#endif

using namespace nvinfer1;

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

namespace {

int gFailures = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            ++gFailures;                                                            \
        }                                                                           \
    } while (0)

// ---- memory: device buffers on a GPU, host buffers in the emulator -------------------------

#ifdef VDET_LAUNCH_EMULATION
using Stream = cudaStream_t;
Stream makeStream() { return nullptr; }
void freeStream(Stream) {}
void* deviceAlloc(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes == 0 ? 1 : bytes) != 0) std::abort();
    return p;
}
void deviceFree(void* p) { std::free(p); }
void toDevice(void* dst, void const* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void toHost(void* dst, void const* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void fill(void* dst, int value, size_t bytes) { std::memset(dst, value, bytes); }
void sync(Stream) {}
// Host time: the emulator runs the kernels synchronously inside enqueue.
class Timer {
public:
    void start(Stream) { mStart = std::chrono::steady_clock::now(); }
    double stopMs(Stream) {
        std::chrono::duration<double, std::milli> const ms = std::chrono::steady_clock::now() - mStart;
        return ms.count();
    }

private:
    std::chrono::steady_clock::time_point mStart;
};
#else
void cuda(cudaError_t status, char const* what) {
    if (status != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
        std::exit(2);
    }
}
using Stream = cudaStream_t;
Stream makeStream() {
    Stream s = nullptr;
    cuda(cudaStreamCreate(&s), "cudaStreamCreate");
    return s;
}
void freeStream(Stream s) { cuda(cudaStreamDestroy(s), "cudaStreamDestroy"); }
void* deviceAlloc(size_t bytes) {
    void* p = nullptr;
    cuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    return p;
}
void deviceFree(void* p) { cuda(cudaFree(p), "cudaFree"); }
void toDevice(void* dst, void const* src, size_t bytes) {
    cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void toHost(void* dst, void const* src, size_t bytes) {
    cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
void fill(void* dst, int value, size_t bytes) { cuda(cudaMemset(dst, value, bytes), "cudaMemset"); }
void sync(Stream s) { cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
// Device time between two events recorded on the stream.
class Timer {
public:
    Timer() {
        cuda(cudaEventCreate(&mStart), "cudaEventCreate");
        cuda(cudaEventCreate(&mStop), "cudaEventCreate");
    }
    ~Timer() {
        cudaEventDestroy(mStart);
        cudaEventDestroy(mStop);
    }
    Timer(Timer const&) = delete;
    Timer& operator=(Timer const&) = delete;
    void start(Stream s) { cuda(cudaEventRecord(mStart, s), "cudaEventRecord"); }
    double stopMs(Stream s) {
        cuda(cudaEventRecord(mStop, s), "cudaEventRecord");
        cuda(cudaEventSynchronize(mStop), "cudaEventSynchronize");
        float ms = 0.0F;
        cuda(cudaEventElapsedTime(&ms, mStart, mStop), "cudaEventElapsedTime");
        return static_cast<double>(ms);
    }

private:
    cudaEvent_t mStart{};
    cudaEvent_t mStop{};
};
#endif

struct Buffer {
    explicit Buffer(size_t n) : bytes(n), ptr(deviceAlloc(n)) {}
    ~Buffer() { deviceFree(ptr); }
    Buffer(Buffer const&) = delete;
    Buffer& operator=(Buffer const&) = delete;
    size_t bytes;
    void* ptr;
};

// ---- plugin access ----------------------------------------------------------------------------

struct Params {
    float score = 0.25F;
    float iou = 0.45F;
    int32_t topK = 1000;
    int32_t maxDet = 300;
    int32_t agnostic = 0;
};

IPluginCreatorV3One* creator() {
    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    if (n != 1 || creators == nullptr || creators[0] == nullptr) return nullptr;
    if (std::strcmp(creators[0]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0) {
        return nullptr;
    }
    return static_cast<IPluginCreatorV3One*>(creators[0]);
}

std::unique_ptr<IPluginV3> create(Params const& p, TensorRTPhase phase = TensorRTPhase::kBUILD) {
    std::vector<PluginField> fields{
        {"score_threshold", &p.score, PluginFieldType::kFLOAT32, 1},
        {"iou_threshold", &p.iou, PluginFieldType::kFLOAT32, 1},
        {"top_k", &p.topK, PluginFieldType::kINT32, 1},
        {"max_det", &p.maxDet, PluginFieldType::kINT32, 1},
        {"class_agnostic", &p.agnostic, PluginFieldType::kINT32, 1},
    };
    PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
    return std::unique_ptr<IPluginV3>(creator()->createPlugin("harness", &fc, phase));
}

template <typename T>
T* capability(IPluginV3& plugin, PluginCapabilityType type) {
    return static_cast<T*>(plugin.getCapabilityInterface(type));
}

IPluginV3OneBuild* build(IPluginV3& p) {
    return capability<IPluginV3OneBuild>(p, PluginCapabilityType::kBUILD);
}
IPluginV3OneRuntime* runtime(IPluginV3& p) {
    return capability<IPluginV3OneRuntime>(p, PluginCapabilityType::kRUNTIME);
}

Dims dims(std::vector<int64_t> const& values) {
    Dims d{};
    d.nbDims = static_cast<int32_t>(values.size());
    for (size_t i = 0; i < values.size(); ++i) d.d[i] = values[i];
    return d;
}

PluginTensorDesc desc(std::vector<int64_t> const& shape, DataType type) {
    PluginTensorDesc d{};
    d.dims = dims(shape);
    d.type = type;
    d.format = TensorFormat::kLINEAR;
    d.scale = -1.0F;
    return d;
}

DynamicPluginTensorDesc dynamicDesc(std::vector<int64_t> const& shape,
                                    std::vector<int64_t> const& maxShape, DataType type) {
    DynamicPluginTensorDesc d{};
    d.desc = desc(shape, type);
    d.min = dims(shape);
    d.opt = dims(shape);
    d.max = dims(maxShape);
    return d;
}

// ---- getOutputShapes: a stand-in for the builder's dimension expressions -------------------
//
// TensorRT's builder hands getOutputShapes an IExprBuilder and input dimensions as
// IDimensionExpr objects; both are thin wrappers over implementation classes (apiv::) that only
// TensorRT makes. This stand-in supplies those implementation classes with the least behaviour
// that lets the harness read the plugin's answer: an expression is a constant or an opaque
// symbol (a dynamic dimension such as the batch), and operation() folds constants (any other
// operation yields a fresh symbol). It is not TensorRT's shape analysis and checks nothing
// about it; it only shows which expression the plugin put in each output dimension.

class ShapeExpr final : public IDimensionExpr {
public:
    ShapeExpr(bool constant, int64_t value, int32_t symbol) : mState(constant, value, symbol) {
        mImpl = &mState;
    }
    ~ShapeExpr() noexcept override = default;
    int32_t symbol() const { return mState.symbol; }

private:
    struct State final : apiv::VDimensionExpr {
        State(bool c, int64_t v, int32_t s) : constant(c), value(v), symbol(s) {}
        bool isConstant() const override { return constant; }
        int64_t getConstantValue() const override { return constant ? value : -1; }
        bool isSizeTensor() const override { return false; }
        bool constant;
        int64_t value;
        int32_t symbol;  // 0 for constants
    };
    State mState;
};

class ShapeExprBuilder final : public IExprBuilder {
public:
    ShapeExprBuilder() { mImpl = &mState; }
    ~ShapeExprBuilder() noexcept override = default;
    // A dynamic dimension (what TensorRT passes for a -1 in the network's input shape).
    IDimensionExpr const* symbol() { return mState.make(false, 0); }
    IDimensionExpr const* value(int64_t v) { return mState.make(true, v); }

private:
    struct State final : apiv::VExprBuilder {
        IDimensionExpr const* make(bool constant, int64_t v) {
            exprs.push_back(std::make_unique<ShapeExpr>(constant, v, constant ? 0 : ++symbols));
            return exprs.back().get();
        }
        IDimensionExpr const* constant(int64_t v) override { return make(true, v); }
        IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& a,
                                        IDimensionExpr const& b) override {
            if (!a.isConstant() || !b.isConstant()) return make(false, 0);
            int64_t const x = a.getConstantValue(), y = b.getConstantValue();
            switch (op) {
                case DimensionOperation::kSUM: return make(true, x + y);
                case DimensionOperation::kPROD: return make(true, x * y);
                case DimensionOperation::kMAX: return make(true, std::max(x, y));
                case DimensionOperation::kMIN: return make(true, std::min(x, y));
                case DimensionOperation::kSUB: return make(true, x - y);
                default: return make(false, 0);
            }
        }
        IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&,
                                                IDimensionExpr const&) override {
            return nullptr;  // the plugin has no size-tensor output
        }
        std::vector<std::unique_ptr<ShapeExpr>> exprs;
        int32_t symbols = 0;
    };
    State mState;
};

bool isConstant(IDimensionExpr const* e, int64_t value) {
    return e != nullptr && e->isConstant() && e->getConstantValue() == value;
}

// IEEE half bits of a float, rounded to nearest even. The heads given to the harness hold
// values that half represents exactly (subnormals included: tiny scores are common), so in
// practice nothing is rounded; overflow gives infinity, NaN stays NaN.
uint16_t halfBits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    uint32_t const sign = (bits >> 16) & 0x8000U;
    uint32_t const magnitude = bits & 0x7FFFFFFFU;
    if (magnitude >= 0x7F800000U) {  // infinity, NaN
        return static_cast<uint16_t>(sign | 0x7C00U | (magnitude > 0x7F800000U ? 0x200U : 0U));
    }
    if (magnitude >= 0x477FF000U) return static_cast<uint16_t>(sign | 0x7C00U);  // >= 65520
    if (magnitude < 0x38800000U) {  // below 2^-14: a half subnormal (or zero), units of 2^-24
        float const units = std::fabs(f) * 16777216.0F;  // exact: a power-of-two scaling
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(units)));
    }
    uint32_t half = (((magnitude >> 23) - 127U + 15U) << 10) | ((magnitude >> 13) & 0x3FFU);
    uint32_t const rest = magnitude & 0x1FFFU;
    if (rest > 0x1000U || (rest == 0x1000U && (half & 1U) != 0U)) ++half;  // may carry into exp
    return static_cast<uint16_t>(sign | half);
}

struct Result {
    std::vector<float> detections;
    std::vector<int32_t> counts;
};

struct RunOptions {
    bool half = false;
    int32_t profileMaxBatch = 0;  // the optimization profile's max batch (0: the run's batch)
    int32_t timeIters = 0;        // 0: no timing
};

struct Timing {
    int32_t iters = 0;
    double minMs = 0, medianMs = 0, meanMs = 0, maxMs = 0;
    double backToBackMs = 0;  // mean per enqueue of `iters` enqueues queued without a sync
};

// Runs the plugin like an execution context would: onShapeChange, then enqueue with a workspace
// of getWorkspaceSize() for the profile (TensorRT sizes it for the profile's max shapes).
bool run(IPluginV3& plugin, std::vector<float> const& raw, int32_t batch, int32_t rows,
         int32_t anchors, RunOptions const& options, Result& result, Timing* timing = nullptr) {
    IPluginV3OneBuild* b = build(plugin);
    IPluginV3OneRuntime* r = runtime(plugin);
    int32_t maxDet = 0;
    {
        // The serialized fields carry max_det.
        PluginFieldCollection const* fc = r->getFieldsToSerialize();
        for (int32_t i = 0; i < fc->nbFields; ++i) {
            if (std::strcmp(fc->fields[i].name, "max_det") == 0) {
                std::memcpy(&maxDet, fc->fields[i].data, 4);
            }
        }
    }
    bool const half = options.half;
    int32_t const maxBatch = std::max(batch, options.profileMaxBatch);
    DataType const inType = half ? DataType::kHALF : DataType::kFLOAT;
    PluginTensorDesc in = desc({batch, rows, anchors}, inType);
    PluginTensorDesc out[2] = {desc({batch, maxDet, 6}, DataType::kFLOAT),
                               desc({batch}, DataType::kINT32)};
    if (r->onShapeChange(&in, 1, out, 2) != 0) return false;
    DynamicPluginTensorDesc dynIn = dynamicDesc({batch, rows, anchors}, {maxBatch, rows, anchors},
                                                inType);
    DynamicPluginTensorDesc dynOut[2] = {
        dynamicDesc({batch, maxDet, 6}, {maxBatch, maxDet, 6}, DataType::kFLOAT),
        dynamicDesc({batch}, {maxBatch}, DataType::kINT32)};
    size_t const workspaceBytes = b->getWorkspaceSize(&dynIn, 1, dynOut, 2);

    size_t const elements = raw.size();
    std::vector<uint16_t> halves;
    if (half) {
        halves.resize(elements);
        for (size_t i = 0; i < elements; ++i) halves[i] = halfBits(raw[i]);
    }
    Buffer input(elements * (half ? 2 : 4));
    Buffer dets(static_cast<size_t>(batch) * maxDet * 6 * 4);
    Buffer counts(static_cast<size_t>(batch) * 4);
    // Offset by 16 bytes: TensorRT does not promise an aligned workspace; the plugin aligns it.
    Buffer workspace(workspaceBytes + 16);
    toDevice(input.ptr, half ? static_cast<void const*>(halves.data()) : raw.data(), input.bytes);
    fill(dets.ptr, 0x7F, dets.bytes);  // garbage the plugin must overwrite
    fill(counts.ptr, 0x7F, counts.bytes);
    fill(workspace.ptr, 0x7F, workspace.bytes);  // and garbage it must not depend on
    Stream stream = makeStream();
    void const* inputs[] = {input.ptr};
    void* outputs[] = {dets.ptr, counts.ptr};
    void* const scratch = static_cast<char*>(workspace.ptr) + 16;
    auto enqueue = [&]() { return r->enqueue(&in, out, inputs, outputs, scratch, stream); };
    int32_t status = enqueue();
    sync(stream);
    if (status != 0) {
        freeStream(stream);
        return false;
    }
    result.detections.resize(static_cast<size_t>(batch) * maxDet * 6);
    result.counts.resize(static_cast<size_t>(batch));
    toHost(result.detections.data(), dets.ptr, dets.bytes);
    toHost(result.counts.data(), counts.ptr, counts.bytes);

    bool ok = true;
    if (timing != nullptr && options.timeIters > 0) {
        Timer timer;
        for (int32_t i = 0; i < 3 && status == 0; ++i) status = enqueue();
        sync(stream);
        std::vector<double> ms;
        for (int32_t i = 0; i < options.timeIters && status == 0; ++i) {
            timer.start(stream);
            status = enqueue();
            ms.push_back(timer.stopMs(stream));
        }
        timer.start(stream);
        for (int32_t i = 0; i < options.timeIters && status == 0; ++i) status = enqueue();
        double const total = timer.stopMs(stream);
        sync(stream);
        if (status != 0 || ms.empty()) {
            std::fprintf(stderr, "FAIL enqueue failed while timing\n");
            ok = false;
        } else {
            std::sort(ms.begin(), ms.end());
            double sum = 0;
            for (double v : ms) sum += v;
            timing->iters = options.timeIters;
            timing->minMs = ms.front();
            timing->maxMs = ms.back();
            timing->medianMs = ms[ms.size() / 2];
            timing->meanMs = sum / static_cast<double>(ms.size());
            timing->backToBackMs = total / options.timeIters;
            // Every enqueue must have written the same outputs as the first.
            Result again;
            again.detections.resize(result.detections.size());
            again.counts.resize(result.counts.size());
            toHost(again.detections.data(), dets.ptr, dets.bytes);
            toHost(again.counts.data(), counts.ptr, counts.bytes);
            if (std::memcmp(again.detections.data(), result.detections.data(), dets.bytes) != 0 ||
                std::memcmp(again.counts.data(), result.counts.data(), counts.bytes) != 0) {
                std::fprintf(stderr, "FAIL repeated enqueues wrote different outputs\n");
                ok = false;
            }
        }
    }
    freeStream(stream);
    return ok;
}

// ---- self-checks ------------------------------------------------------------------------------

void checkCreator() {
    IPluginCreatorV3One* c = creator();
    CHECK(c != nullptr);
    if (c == nullptr) return;
    CHECK(std::strcmp(c->getPluginName(), "VdetDecodeNms") == 0);
    CHECK(std::strcmp(c->getPluginVersion(), "1") == 0);
    CHECK(std::strcmp(c->getPluginNamespace(), "vdet") == 0);
    PluginFieldCollection const* fc = c->getFieldNames();
    CHECK(fc != nullptr && fc->nbFields == 5);
    char const* names[] = {"score_threshold", "iou_threshold", "top_k", "max_det",
                           "class_agnostic"};
    PluginFieldType types[] = {PluginFieldType::kFLOAT32, PluginFieldType::kFLOAT32,
                               PluginFieldType::kINT32, PluginFieldType::kINT32,
                               PluginFieldType::kINT32};
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields && i < 5; ++i) {
        CHECK(std::strcmp(fc->fields[i].name, names[i]) == 0);
        CHECK(fc->fields[i].type == types[i]);
    }
}

void checkCoreAndBuild() {
    Params p;
    p.score = 0.3F;
    p.iou = 0.5F;
    p.topK = 512;
    p.maxDet = 100;
    p.agnostic = 1;
    auto plugin = create(p);
    CHECK(plugin != nullptr);
    if (!plugin) return;
    auto* core = capability<IPluginV3OneCore>(*plugin, PluginCapabilityType::kCORE);
    CHECK(std::strcmp(core->getPluginName(), "VdetDecodeNms") == 0);
    CHECK(std::strcmp(core->getPluginNamespace(), "vdet") == 0);
    IPluginV3OneBuild* b = build(*plugin);
    CHECK(b->getNbOutputs() == 2);

    DataType out[2];
    DataType in = DataType::kFLOAT;
    CHECK(b->getOutputDataTypes(out, 2, &in, 1) == 0);
    CHECK(out[0] == DataType::kFLOAT && out[1] == DataType::kINT32);
    in = DataType::kHALF;
    CHECK(b->getOutputDataTypes(out, 2, &in, 1) == 0);
    CHECK(out[0] == DataType::kFLOAT && out[1] == DataType::kINT32);
    in = DataType::kINT32;
    CHECK(b->getOutputDataTypes(out, 2, &in, 1) != 0);

    // supportsFormatCombination: the head float/half, detections float, count int32; linear.
    struct Case {
        int32_t pos;
        DataType type;
        TensorFormat format;
        bool ok;
    };
    Case const cases[] = {
        {0, DataType::kFLOAT, TensorFormat::kLINEAR, true},
        {0, DataType::kHALF, TensorFormat::kLINEAR, true},
        {0, DataType::kINT8, TensorFormat::kLINEAR, false},
        {0, DataType::kFLOAT, TensorFormat::kCHW32, false},
        {1, DataType::kFLOAT, TensorFormat::kLINEAR, true},
        {1, DataType::kHALF, TensorFormat::kLINEAR, false},
        {2, DataType::kINT32, TensorFormat::kLINEAR, true},
        {2, DataType::kFLOAT, TensorFormat::kLINEAR, false},
    };
    for (Case const& c : cases) {
        DynamicPluginTensorDesc io[3] = {
            dynamicDesc({2, 84, 8400}, {8, 84, 8400}, DataType::kFLOAT),
            dynamicDesc({2, 100, 6}, {8, 100, 6}, DataType::kFLOAT),
            dynamicDesc({2}, {8}, DataType::kINT32)};
        io[c.pos].desc.type = c.type;
        io[c.pos].desc.format = c.format;
        bool const got = b->supportsFormatCombination(c.pos, io, 1, 2);
        if (got != c.ok) {
            std::fprintf(stderr, "FAIL supportsFormatCombination pos %d type %d format %d\n",
                         c.pos, static_cast<int>(c.type), static_cast<int>(c.format));
            ++gFailures;
        }
    }

    DynamicPluginTensorDesc dynIn = dynamicDesc({1, 84, 8400}, {8, 84, 8400}, DataType::kFLOAT);
    DynamicPluginTensorDesc dynOut[2] = {dynamicDesc({1, 100, 6}, {8, 100, 6}, DataType::kFLOAT),
                                         dynamicDesc({1}, {8}, DataType::kINT32)};
    CHECK(b->configurePlugin(&dynIn, 1, dynOut, 2) == 0);
    size_t const atMax = b->getWorkspaceSize(&dynIn, 1, dynOut, 2);
    dynIn.max = dims({1, 84, 8400});
    size_t const atOne = b->getWorkspaceSize(&dynIn, 1, dynOut, 2);
    CHECK(atMax > atOne && atOne > 256);
    DynamicPluginTensorDesc badIn = dynamicDesc({1, 84}, {1, 84}, DataType::kFLOAT);
    CHECK(b->configurePlugin(&badIn, 1, dynOut, 2) != 0);
    DynamicPluginTensorDesc noClass = dynamicDesc({1, 4, 10}, {1, 4, 10}, DataType::kFLOAT);
    CHECK(b->configurePlugin(&noClass, 1, dynOut, 2) != 0);
    CHECK(b->getTimingCacheID() != nullptr &&
          std::strstr(b->getTimingCacheID(), "max_det=100") != nullptr);
}

// getOutputShapes: detections [B, max_det, 6] and num_detections [B], with B the input's own
// batch expression (a dynamic batch stays the same symbol), max_det and 6 constants.
void checkOutputShapes() {
    Params p;
    p.maxDet = 123;
    auto plugin = create(p);
    CHECK(plugin != nullptr);
    if (!plugin) return;
    IPluginV3OneBuild* b = build(*plugin);
    for (bool dynamicBatch : {true, false}) {
        ShapeExprBuilder exprs;
        DimsExprs in{};
        in.nbDims = 3;
        in.d[0] = dynamicBatch ? exprs.symbol() : exprs.value(4);
        in.d[1] = exprs.value(84);
        in.d[2] = exprs.symbol();  // anchors: dynamic too (any input size)
        DimsExprs out[2]{};
        CHECK(b->getOutputShapes(&in, 1, nullptr, 0, out, 2, exprs) == 0);
        CHECK(out[0].nbDims == 3 && out[1].nbDims == 1);
        if (out[0].nbDims != 3 || out[1].nbDims != 1) continue;
        if (dynamicBatch) {
            CHECK(out[0].d[0] != nullptr && !out[0].d[0]->isConstant());
            CHECK(out[0].d[0] == in.d[0] && out[1].d[0] == in.d[0]);
        } else {
            CHECK(isConstant(out[0].d[0], 4) && isConstant(out[1].d[0], 4));
        }
        CHECK(isConstant(out[0].d[1], 123));
        CHECK(isConstant(out[0].d[2], 6));
    }
    // Refusals: a rank-2 input, a shape input, the wrong number of inputs.
    ShapeExprBuilder exprs;
    DimsExprs in{};
    in.nbDims = 2;
    in.d[0] = exprs.symbol();
    in.d[1] = exprs.value(84);
    DimsExprs out[2]{};
    CHECK(b->getOutputShapes(&in, 1, nullptr, 0, out, 2, exprs) != 0);
    in.nbDims = 3;
    in.d[2] = exprs.value(8400);
    CHECK(b->getOutputShapes(&in, 1, &in, 1, out, 2, exprs) != 0);
    DimsExprs two[2] = {in, in};
    CHECK(b->getOutputShapes(two, 2, nullptr, 0, out, 2, exprs) != 0);
}

void checkSerialization() {
    Params p;
    p.score = 0.125F;
    p.iou = 0.7F;
    p.topK = 4096;
    p.maxDet = 1;
    p.agnostic = 1;
    auto plugin = create(p);
    CHECK(plugin != nullptr);
    if (!plugin) return;
    PluginFieldCollection const* fc = runtime(*plugin)->getFieldsToSerialize();
    CHECK(fc != nullptr && fc->nbFields == 5);
    // What deserializing an engine does: the serialized fields back into the creator.
    auto again = std::unique_ptr<IPluginV3>(
        creator()->createPlugin("deserialized", fc, TensorRTPhase::kRUNTIME));
    CHECK(again != nullptr);
    if (!again) return;
    PluginFieldCollection const* fc2 = runtime(*again)->getFieldsToSerialize();
    CHECK(fc2->nbFields == fc->nbFields);
    for (int32_t i = 0; i < fc->nbFields && i < fc2->nbFields; ++i) {
        CHECK(std::strcmp(fc->fields[i].name, fc2->fields[i].name) == 0);
        CHECK(fc->fields[i].type == fc2->fields[i].type);
        CHECK(std::memcmp(fc->fields[i].data, fc2->fields[i].data, 4) == 0);
    }
    float score = 0.0F;
    std::memcpy(&score, fc2->fields[0].data, 4);
    CHECK(score == 0.125F);
    // attachToContext clones the whole plugin.
    auto attached = std::unique_ptr<IPluginV3>(runtime(*plugin)->attachToContext(nullptr));
    CHECK(attached != nullptr && attached.get() != plugin.get());
    auto cloned = std::unique_ptr<IPluginV3>(plugin->clone());
    CHECK(cloned != nullptr);
}

void checkRefusals() {
    auto refused = [](Params const& p) { return create(p) == nullptr; };
    Params p;
    p.topK = 0;
    CHECK(refused(p));
    p = Params{};
    p.topK = 4097;
    CHECK(refused(p));
    p = Params{};
    p.maxDet = 0;
    CHECK(refused(p));
    p = Params{};
    p.score = 1.5F;
    CHECK(refused(p));
    p = Params{};
    p.iou = std::nanf("");
    CHECK(refused(p));
    p = Params{};
    p.agnostic = 2;
    CHECK(refused(p));
    // A field of the wrong type (what an ONNX INT where FLOAT belongs would give).
    int32_t const wrong = 1;
    PluginField field{"score_threshold", &wrong, PluginFieldType::kINT32, 1};
    PluginFieldCollection fc{1, &field};
    CHECK(creator()->createPlugin("bad", &fc, TensorRTPhase::kBUILD) == nullptr);
    // No fields at all: the CPU reference's defaults.
    PluginFieldCollection empty{0, nullptr};
    auto defaults = std::unique_ptr<IPluginV3>(
        creator()->createPlugin("defaults", &empty, TensorRTPhase::kBUILD));
    CHECK(defaults != nullptr);
}

// Raw head [2, 4 + 3, 5]; see docs/tensorrt.md for the hand-computed answer.
std::vector<float> handMadeHead() {
    int32_t const rows = 7, anchors = 5;
    std::vector<float> raw(static_cast<size_t>(2 * rows * anchors), 0.1F);
    auto at = [&](int32_t b, int32_t r, int32_t a) -> float& {
        return raw[static_cast<size_t>((b * rows + r) * anchors + a)];
    };
    float const boxes[5][4] = {
        {50, 50, 20, 20}, {52, 50, 20, 20}, {52, 50, 20, 20}, {10, 10, 4, 4}, {150, 150, 30, 10}};
    float const scores[5][3] = {
        {0.875F, 0.125F, 0.125F},  // kept, class 0
        {0.75F, 0.125F, 0.125F},   // IoU 0.818 with anchor 0, class 0: suppressed
        {0.125F, 0.625F, 0.125F},  // same box, class 1: kept unless agnostic
        {0.25F, 0.25F, 0.25F},     // score == threshold: dropped (strict)
        {0.125F, 0.125F, 0.5F},    // far away, class 2: kept
    };
    for (int32_t b = 0; b < 2; ++b) {
        for (int32_t a = 0; a < anchors; ++a) {
            for (int32_t r = 0; r < 4; ++r) at(b, r, a) = boxes[a][r];
            for (int32_t c = 0; c < 3; ++c) at(b, 4 + c, a) = b == 0 ? scores[a][c] : 0.125F;
        }
    }
    return raw;
}

void expectRow(Result const& result, int32_t maxDet, int32_t image, int32_t row,
               std::vector<float> const& expected) {
    for (int32_t k = 0; k < 6; ++k) {
        float const got = result.detections[static_cast<size_t>((image * maxDet + row) * 6 + k)];
        if (got != expected[static_cast<size_t>(k)]) {
            std::fprintf(stderr, "FAIL image %d row %d field %d: got %.9g, expected %.9g\n", image,
                         row, k, static_cast<double>(got),
                         static_cast<double>(expected[static_cast<size_t>(k)]));
            ++gFailures;
        }
    }
}

void checkEnqueue(bool half, int32_t agnostic) {
    Params p;
    p.maxDet = 4;
    p.agnostic = agnostic;
    auto plugin = create(p);
    CHECK(plugin != nullptr);
    if (!plugin) return;
    Result result;
    RunOptions options;
    options.half = half;
    bool const ok = run(*plugin, handMadeHead(), 2, 7, 5, options, result);
    CHECK(ok);
    if (!ok) return;
    std::vector<std::vector<float>> rows = {{40, 40, 60, 60, 0.875F, 0}};
    if (agnostic == 0) rows.push_back({42, 40, 62, 60, 0.625F, 1});
    rows.push_back({135, 145, 165, 155, 0.5F, 2});
    CHECK(result.counts[0] == static_cast<int32_t>(rows.size()));
    CHECK(result.counts[1] == 0);
    for (int32_t i = 0; i < 4; ++i) {
        expectRow(result, 4, 0, i,
                  i < static_cast<int32_t>(rows.size()) ? rows[static_cast<size_t>(i)]
                                                        : std::vector<float>(6, 0.0F));
        expectRow(result, 4, 1, i, std::vector<float>(6, 0.0F));
    }
}

// ---- --raw mode -------------------------------------------------------------------------------

bool readFile(std::string const& path, std::vector<char>& data) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
}

bool writeFile(std::string const& path, void const* data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<char const*>(data), static_cast<std::streamsize>(bytes));
    return static_cast<bool>(f);
}

int rawMode(int argc, char** argv) {
    Params p;
    std::string rawPath, outPath, countPath, timingPath;
    int64_t shape[3] = {0, 0, 0};
    RunOptions options;
    for (int i = 1; i < argc; ++i) {
        std::string const arg = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (arg == "--raw") rawPath = next();
        else if (arg == "--out") outPath = next();
        else if (arg == "--count") countPath = next();
        else if (arg == "--half") options.half = true;
        else if (arg == "--max-batch") options.profileMaxBatch = std::atoi(next().c_str());
        else if (arg == "--time") options.timeIters = std::atoi(next().c_str());
        else if (arg == "--timing") timingPath = next();
        else if (arg == "--agnostic") p.agnostic = 1;
        else if (arg == "--score") p.score = std::strtof(next().c_str(), nullptr);
        else if (arg == "--iou") p.iou = std::strtof(next().c_str(), nullptr);
        else if (arg == "--top-k") p.topK = std::atoi(next().c_str());
        else if (arg == "--max-det") p.maxDet = std::atoi(next().c_str());
        else if (arg == "--shape") {
            std::string const s = next();
            if (std::sscanf(s.c_str(), "%ld,%ld,%ld", &shape[0], &shape[1], &shape[2]) != 3) {
                std::fprintf(stderr, "--shape B,R,N\n");
                return 2;
            }
        } else {
            std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
            return 2;
        }
    }
    std::vector<char> bytes;
    size_t const elements = static_cast<size_t>(shape[0] * shape[1] * shape[2]);
    if (!readFile(rawPath, bytes) || bytes.size() != elements * 4) {
        std::fprintf(stderr, "%s must hold %zu float32 values\n", rawPath.c_str(), elements);
        return 2;
    }
    std::vector<float> raw(elements);
    std::memcpy(raw.data(), bytes.data(), bytes.size());
    auto plugin = create(p);
    if (!plugin) {
        std::fprintf(stderr, "createPlugin refused the parameters\n");
        return 2;
    }
    if (options.timeIters > 0 && timingPath.empty()) {
        std::fprintf(stderr, "--time needs --timing <file>\n");
        return 2;
    }
    Result result;
    Timing timing;
    if (!run(*plugin, raw, static_cast<int32_t>(shape[0]), static_cast<int32_t>(shape[1]),
             static_cast<int32_t>(shape[2]), options, result, &timing)) {
        std::fprintf(stderr, "enqueue failed\n");
        return 1;
    }
    if (options.timeIters > 0) {
        char text[512];
        std::snprintf(text, sizeof(text),
                      "{\"clock\": \"%s\", \"iters\": %d, \"min_ms\": %.6f, "
                      "\"median_ms\": %.6f, \"mean_ms\": %.6f, \"max_ms\": %.6f, "
                      "\"back_to_back_mean_ms\": %.6f}\n",
#ifdef VDET_LAUNCH_EMULATION
                      "host (CPU emulator)",
#else
                      "cuda events",
#endif
                      timing.iters, timing.minMs, timing.medianMs, timing.meanMs, timing.maxMs,
                      timing.backToBackMs);
        if (!writeFile(timingPath, text, std::strlen(text))) {
            std::fprintf(stderr, "cannot write %s\n", timingPath.c_str());
            return 2;
        }
        std::printf("%s", text);
    }
    if (!writeFile(outPath, result.detections.data(), result.detections.size() * 4) ||
        !writeFile(countPath, result.counts.data(), result.counts.size() * 4)) {
        std::fprintf(stderr, "cannot write the outputs\n");
        return 2;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1) return rawMode(argc, argv);
    checkCreator();
    checkCoreAndBuild();
    checkOutputShapes();
    checkSerialization();
    checkRefusals();
    for (bool half : {false, true}) {
        for (int32_t agnostic : {0, 1}) checkEnqueue(half, agnostic);
    }
    if (gFailures != 0) {
        std::fprintf(stderr, "%d check(s) failed\n", gFailures);
        return 1;
    }
    std::printf("plugin harness: all checks passed\n");
    return 0;
}
