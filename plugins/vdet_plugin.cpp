/* VdetDecodeNms: see vdet_plugin.h. */
#include "vdet_plugin.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>

#include "kernels/vdet_contract.h"

namespace vdet {
namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::TensorFormat;

constexpr int32_t kNbInputs = 1;
constexpr int32_t kNbOutputs = 2;
constexpr int32_t kFieldsPerDetection = 6;
constexpr size_t kWorkspaceAlign = 256;  // decode_nms_launch wants a 256-byte aligned workspace
constexpr int32_t kDefaultSharedBytes = 48 * 1024;

class LoggerFinder {
public:
    void set(nvinfer1::ILoggerFinder* finder) {
        std::lock_guard<std::mutex> lock(mMutex);
        if (mFinder == nullptr && finder != nullptr) mFinder = finder;
    }

    void log(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept {
        try {
            nvinfer1::ILogger* logger = nullptr;
            {
                std::lock_guard<std::mutex> lock(mMutex);
                if (mFinder != nullptr) logger = mFinder->findLogger();
            }
            std::string const text = std::string(kPluginName) + ": " + message;
            if (logger != nullptr) {
                logger->log(severity, text.c_str());
            } else if (severity <= nvinfer1::ILogger::Severity::kWARNING) {
                std::fprintf(stderr, "%s\n", text.c_str());
            }
        } catch (...) {
            // Logging must never take the engine down.
        }
    }

private:
    std::mutex mMutex;
    nvinfer1::ILoggerFinder* mFinder{nullptr};
};

LoggerFinder& loggerFinder() {
    static LoggerFinder finder;
    return finder;
}

void logError(std::string const& message) noexcept {
    loggerFinder().log(nvinfer1::ILogger::Severity::kERROR, message);
}

std::string describe(VdetDecodeNmsParams const& p) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "%s v%s score_threshold=%.9g iou_threshold=%.9g top_k=%d max_det=%d "
                  "class_agnostic=%d",
                  kPluginName, kPluginVersion, static_cast<double>(p.score_threshold),
                  static_cast<double>(p.iou_threshold), p.top_k, p.max_det, p.class_agnostic);
    return text;
}

bool readFloat(PluginField const& field, float& value, std::string& error) {
    if (field.type != PluginFieldType::kFLOAT32 || field.length != 1 || field.data == nullptr) {
        error = std::string("field ") + field.name + " must be one kFLOAT32";
        return false;
    }
    std::memcpy(&value, field.data, sizeof(float));
    return true;
}

bool readInt(PluginField const& field, int32_t& value, std::string& error) {
    if (field.type != PluginFieldType::kINT32 || field.length != 1 || field.data == nullptr) {
        error = std::string("field ") + field.name + " must be one kINT32";
        return false;
    }
    std::memcpy(&value, field.data, sizeof(int32_t));
    return true;
}

}  // namespace

VdetDecodeNmsParams defaultParams() noexcept {
    VdetDecodeNmsParams p{};
    p.score_threshold = VDET_DEFAULT_SCORE_THRESHOLD;
    p.iou_threshold = VDET_DEFAULT_IOU_THRESHOLD;
    p.top_k = VDET_DEFAULT_TOP_K;
    p.max_det = VDET_DEFAULT_MAX_DET;
    p.class_agnostic = VDET_DEFAULT_CLASS_AGNOSTIC;
    return p;
}

bool paramsFromFields(PluginFieldCollection const& fc, VdetDecodeNmsParams& params,
                      std::string& error) noexcept {
    try {
        VdetDecodeNmsParams p = defaultParams();
        if (fc.nbFields < 0 || (fc.nbFields > 0 && fc.fields == nullptr)) {
            error = "malformed PluginFieldCollection";
            return false;
        }
        for (int32_t i = 0; i < fc.nbFields; ++i) {
            PluginField const& f = fc.fields[i];
            if (f.name == nullptr) continue;
            bool ok = true;
            if (std::strcmp(f.name, "score_threshold") == 0) {
                ok = readFloat(f, p.score_threshold, error);
            } else if (std::strcmp(f.name, "iou_threshold") == 0) {
                ok = readFloat(f, p.iou_threshold, error);
            } else if (std::strcmp(f.name, "top_k") == 0) {
                ok = readInt(f, p.top_k, error);
            } else if (std::strcmp(f.name, "max_det") == 0) {
                ok = readInt(f, p.max_det, error);
            } else if (std::strcmp(f.name, "class_agnostic") == 0) {
                ok = readInt(f, p.class_agnostic, error);
            }
            // Unknown fields are ignored: the ONNX parser only passes the names we list.
            if (!ok) return false;
        }
        if (vdet_decode_nms_check(&p) != 0) {
            error = std::string(vdet_decode_nms_error(vdet_decode_nms_check(&p))) + " (got " +
                    describe(p) + ")";
            return false;
        }
        params = p;
        return true;
    } catch (std::exception const& e) {
        error = e.what();
        return false;
    }
}

// ---- plugin ---------------------------------------------------------------------------------

DecodeNmsPlugin::DecodeNmsPlugin(VdetDecodeNmsParams params)
    : mParams(params), mDescription(describe(params)) {}

DecodeNmsPlugin::DecodeNmsPlugin(DecodeNmsPlugin const& other)
    : nvinfer1::IPluginV3(other),
      nvinfer1::IPluginV3OneCore(other),
      nvinfer1::IPluginV3OneBuild(other),
      nvinfer1::IPluginV3OneRuntime(other),
      mParams(other.mParams),
      mMaxSharedBytes(other.mMaxSharedBytes),
      mDescription(other.mDescription) {}

nvinfer1::IPluginCapability* DecodeNmsPlugin::getCapabilityInterface(
    nvinfer1::PluginCapabilityType type) noexcept {
    switch (type) {
        case nvinfer1::PluginCapabilityType::kCORE:
            return static_cast<nvinfer1::IPluginV3OneCore*>(this);
        case nvinfer1::PluginCapabilityType::kBUILD:
            return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
        case nvinfer1::PluginCapabilityType::kRUNTIME:
            return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

nvinfer1::IPluginV3* DecodeNmsPlugin::clone() noexcept {
    try {
        return new DecodeNmsPlugin(*this);
    } catch (std::exception const& e) {
        logError(std::string("clone failed: ") + e.what());
        return nullptr;
    }
}

char const* DecodeNmsPlugin::getPluginName() const noexcept { return kPluginName; }
char const* DecodeNmsPlugin::getPluginVersion() const noexcept { return kPluginVersion; }
char const* DecodeNmsPlugin::getPluginNamespace() const noexcept { return kPluginNamespace; }

int32_t DecodeNmsPlugin::getNbOutputs() const noexcept { return kNbOutputs; }

int32_t DecodeNmsPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in,
                                         int32_t nbInputs,
                                         nvinfer1::DynamicPluginTensorDesc const* out,
                                         int32_t nbOutputs) noexcept {
    if (in == nullptr || out == nullptr || nbInputs != kNbInputs || nbOutputs != kNbOutputs) {
        logError("expects 1 input (the raw head) and 2 outputs");
        return -1;
    }
    nvinfer1::Dims const& dims = in[0].desc.dims;
    if (dims.nbDims != 3) {
        logError("the raw head must have rank 3 [B, 4 + nc, N]");
        return -1;
    }
    if (dims.d[1] >= 0 && dims.d[1] < 5) {
        logError("the raw head needs 4 box rows and at least one class row");
        return -1;
    }
    return 0;
}

int32_t DecodeNmsPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                            DataType const* inputTypes,
                                            int32_t nbInputs) const noexcept {
    if (outputTypes == nullptr || inputTypes == nullptr || nbInputs != kNbInputs ||
        nbOutputs != kNbOutputs) {
        return -1;
    }
    if (inputTypes[0] != DataType::kFLOAT && inputTypes[0] != DataType::kHALF) {
        logError("the raw head must be float32 or float16");
        return -1;
    }
    outputTypes[0] = DataType::kFLOAT;
    outputTypes[1] = DataType::kINT32;
    return 0;
}

int32_t DecodeNmsPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                                         nvinfer1::DimsExprs const* /* shapeInputs */,
                                         int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
                                         int32_t nbOutputs,
                                         nvinfer1::IExprBuilder& exprBuilder) noexcept {
    if (inputs == nullptr || outputs == nullptr || nbInputs != kNbInputs ||
        nbOutputs != kNbOutputs || nbShapeInputs != 0 || inputs[0].nbDims != 3) {
        return -1;
    }
    nvinfer1::IDimensionExpr const* maxDet = exprBuilder.constant(mParams.max_det);
    nvinfer1::IDimensionExpr const* fields = exprBuilder.constant(kFieldsPerDetection);
    if (maxDet == nullptr || fields == nullptr) return -1;
    outputs[0].nbDims = 3;
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = maxDet;
    outputs[0].d[2] = fields;
    outputs[1].nbDims = 1;
    outputs[1].d[0] = inputs[0].d[0];
    return 0;
}

bool DecodeNmsPlugin::supportsFormatCombination(int32_t pos,
                                                nvinfer1::DynamicPluginTensorDesc const* inOut,
                                                int32_t nbInputs, int32_t nbOutputs) noexcept {
    if (inOut == nullptr || nbInputs != kNbInputs || nbOutputs != kNbOutputs || pos < 0 ||
        pos >= kNbInputs + kNbOutputs) {
        return false;
    }
    nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR) return false;
    switch (pos) {
        case 0: return desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
        case 1: return desc.type == DataType::kFLOAT;
        default: return desc.type == DataType::kINT32;
    }
}

size_t DecodeNmsPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs,
                                         int32_t nbInputs,
                                         nvinfer1::DynamicPluginTensorDesc const* /* outputs */,
                                         int32_t /* nbOutputs */) const noexcept {
    if (inputs == nullptr || nbInputs != kNbInputs || inputs[0].max.nbDims != 3) return 0;
    auto const batch = static_cast<int32_t>(inputs[0].max.d[0]);
    auto const anchors = static_cast<int32_t>(inputs[0].max.d[2]);
    // Room to align TensorRT's workspace pointer up to 256 bytes in enqueue.
    return vdet_decode_nms_workspace_bytes(batch, anchors, mParams.top_k) + kWorkspaceAlign;
}

char const* DecodeNmsPlugin::getTimingCacheID() noexcept { return mDescription.c_str(); }

char const* DecodeNmsPlugin::getMetadataString() noexcept { return mDescription.c_str(); }

int32_t DecodeNmsPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
                                       nvinfer1::PluginTensorDesc const* out,
                                       int32_t nbOutputs) noexcept {
    if (in == nullptr || out == nullptr || nbInputs != kNbInputs || nbOutputs != kNbOutputs ||
        in[0].dims.nbDims != 3 || in[0].dims.d[1] < 5) {
        logError("unexpected shapes at execution: the raw head must be [B, 4 + nc, N]");
        return -1;
    }
    if (out[0].dims.nbDims != 3 || out[0].dims.d[1] != mParams.max_det ||
        out[0].dims.d[2] != kFieldsPerDetection || out[1].dims.nbDims != 1) {
        logError("unexpected output shapes at execution");
        return -1;
    }
    return 0;
}

int32_t DecodeNmsPlugin::maxSharedBytes() noexcept {
    if (mMaxSharedBytes > 0) return mMaxSharedBytes;
#ifdef VDET_LAUNCH_EMULATION
    mMaxSharedBytes = kDefaultSharedBytes;
#else
    int device = 0;
    int bytes = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
            cudaSuccess &&
        bytes > 0) {
        mMaxSharedBytes = bytes;
    } else {
        mMaxSharedBytes = kDefaultSharedBytes;
    }
#endif
    return mMaxSharedBytes;
}

int32_t DecodeNmsPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
                                 nvinfer1::PluginTensorDesc const* outputDesc,
                                 void const* const* inputs, void* const* outputs,
                                 void* workspace, cudaStream_t stream) noexcept {
    if (inputDesc == nullptr || outputDesc == nullptr || inputs == nullptr || outputs == nullptr) {
        return -1;
    }
    nvinfer1::Dims const& dims = inputDesc[0].dims;
    if (dims.nbDims != 3) return -1;
    auto const batch = static_cast<int32_t>(dims.d[0]);
    auto const numClasses = static_cast<int32_t>(dims.d[1] - 4);
    auto const anchors = static_cast<int32_t>(dims.d[2]);
    bool const half = inputDesc[0].type == DataType::kHALF;
    size_t const needed = vdet_decode_nms_workspace_bytes(batch, anchors, mParams.top_k);
    auto const address = reinterpret_cast<uintptr_t>(workspace);
    auto const aligned = (address + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    void* scratch = reinterpret_cast<void*>(aligned);
    int const status = vdet_decode_nms_launch(
        inputs[0], half ? 1 : 0, batch, numClasses, anchors, &mParams,
        static_cast<float*>(outputs[0]), static_cast<int*>(outputs[1]), scratch,
        needed, maxSharedBytes(), reinterpret_cast<vdet_stream_t>(stream));
    if (status != 0) {
        logError(std::string("enqueue failed: ") + vdet_decode_nms_error(status));
        return status;
    }
    return 0;
}

nvinfer1::IPluginV3* DecodeNmsPlugin::attachToContext(
    nvinfer1::IPluginResourceContext* /* context */) noexcept {
    return clone();
}

PluginFieldCollection const* DecodeNmsPlugin::getFieldsToSerialize() noexcept {
    try {
        mFieldsToSerialize.clear();
        mFieldsToSerialize.emplace_back("score_threshold", &mParams.score_threshold,
                                        PluginFieldType::kFLOAT32, 1);
        mFieldsToSerialize.emplace_back("iou_threshold", &mParams.iou_threshold,
                                        PluginFieldType::kFLOAT32, 1);
        mFieldsToSerialize.emplace_back("top_k", &mParams.top_k, PluginFieldType::kINT32, 1);
        mFieldsToSerialize.emplace_back("max_det", &mParams.max_det, PluginFieldType::kINT32, 1);
        mFieldsToSerialize.emplace_back("class_agnostic", &mParams.class_agnostic,
                                        PluginFieldType::kINT32, 1);
        mCollection.nbFields = static_cast<int32_t>(mFieldsToSerialize.size());
        mCollection.fields = mFieldsToSerialize.data();
        return &mCollection;
    } catch (std::exception const& e) {
        logError(std::string("getFieldsToSerialize failed: ") + e.what());
        return nullptr;
    }
}

// ---- creator --------------------------------------------------------------------------------

DecodeNmsPluginCreator::DecodeNmsPluginCreator() {
    mFields.emplace_back("score_threshold", nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back("iou_threshold", nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back("top_k", nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back("max_det", nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back("class_agnostic", nullptr, PluginFieldType::kINT32, 1);
    mCollection.nbFields = static_cast<int32_t>(mFields.size());
    mCollection.fields = mFields.data();
}

char const* DecodeNmsPluginCreator::getPluginName() const noexcept { return kPluginName; }
char const* DecodeNmsPluginCreator::getPluginVersion() const noexcept { return kPluginVersion; }
char const* DecodeNmsPluginCreator::getPluginNamespace() const noexcept {
    return kPluginNamespace;
}

PluginFieldCollection const* DecodeNmsPluginCreator::getFieldNames() noexcept {
    return &mCollection;
}

nvinfer1::IPluginV3* DecodeNmsPluginCreator::createPlugin(char const* name,
                                                          PluginFieldCollection const* fc,
                                                          nvinfer1::TensorRTPhase /* phase */) noexcept {
    // The same fields arrive in both phases: from the ONNX node at build time, from
    // getFieldsToSerialize() when an engine is deserialized.
    VdetDecodeNmsParams params = defaultParams();
    std::string error;
    if (fc != nullptr && !paramsFromFields(*fc, params, error)) {
        logError(std::string("node ") + (name != nullptr ? name : "?") + ": " + error);
        return nullptr;
    }
    try {
        return new DecodeNmsPlugin(params);
    } catch (std::exception const& e) {
        logError(std::string("createPlugin failed: ") + e.what());
        return nullptr;
    }
}

}  // namespace vdet

// ---- plugin-library entry points ------------------------------------------------------------

extern "C" VDET_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
    static vdet::DecodeNmsPluginCreator sCreator;
    static nvinfer1::IPluginCreatorInterface* const kCreators[] = {&sCreator};
    nbCreators = 1;
    return kCreators;
}

extern "C" VDET_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
    vdet::loggerFinder().set(finder);
}
