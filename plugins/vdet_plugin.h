/* vdet's TensorRT plugin: VdetDecodeNms (namespace "vdet", version "1"), an IPluginV3.
 *
 * One input, the raw YOLOv8 head [B, 4 + nc, N] (float32 or float16, linear); two outputs:
 *   0 detections      [B, max_det, 6] float32  x1, y1, x2, y2, score, class
 *   1 num_detections  [B] int32
 * computed by the decode + NMS kernels of service/vdet/cuda/kernels/ (the same source the Python GPU
 * path compiles), launched through decode_nms_launch.h. Fields (ONNX attributes of the node that
 * engines/surgery.py adds): score_threshold, iou_threshold (kFLOAT32), top_k, max_det,
 * class_agnostic (kINT32).
 *
 * The library registers its creator through TensorRT's plugin-library entry points
 * (getCreators / setLoggerFinder, for IPluginRegistry::loadLibrary and trtexec
 * --dynamicPlugins), so it needs TensorRT's headers but does not link libnvinfer.
 */
#ifndef VDET_PLUGIN_H
#define VDET_PLUGIN_H

#include <NvInferRuntime.h>

#include <string>
#include <vector>

#include "decode_nms_launch.h"

namespace vdet {

constexpr char const* kPluginName = "VdetDecodeNms";
constexpr char const* kPluginVersion = "1";
constexpr char const* kPluginNamespace = "vdet";

class DecodeNmsPlugin : public nvinfer1::IPluginV3,
                        public nvinfer1::IPluginV3OneCore,
                        public nvinfer1::IPluginV3OneBuild,
                        public nvinfer1::IPluginV3OneRuntime {
public:
    explicit DecodeNmsPlugin(VdetDecodeNmsParams params);
    DecodeNmsPlugin(DecodeNmsPlugin const& other);
    DecodeNmsPlugin& operator=(DecodeNmsPlugin const&) = delete;
    ~DecodeNmsPlugin() override = default;

    VdetDecodeNmsParams const& params() const noexcept { return mParams; }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(
        nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                            nvinfer1::DynamicPluginTensorDesc const* out,
                            int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                               nvinfer1::DataType const* inputTypes,
                               int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                            nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs,
                            nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                            nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
                                   int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                            nvinfer1::DynamicPluginTensorDesc const* outputs,
                            int32_t nbOutputs) const noexcept override;
    char const* getTimingCacheID() noexcept override;
    char const* getMetadataString() noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::PluginTensorDesc const* out,
                          int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
                    nvinfer1::PluginTensorDesc const* outputDesc, void const* const* inputs,
                    void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

    // Dynamic shared memory per block this plugin may use (queried once from the device;
    // tests set it, since the CPU emulator has no device to ask).
    void setMaxSharedBytes(int bytes) noexcept { mMaxSharedBytes = bytes; }

private:
    int32_t maxSharedBytes() noexcept;

    VdetDecodeNmsParams mParams;
    int32_t mMaxSharedBytes{0};
    std::string mDescription;
    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mCollection{};
};

class DecodeNmsPluginCreator : public nvinfer1::IPluginCreatorV3One {
public:
    DecodeNmsPluginCreator();
    ~DecodeNmsPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
                                      nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

// Reads fields into parameters (defaults for absent ones); false, with a message in `error`,
// when a field has the wrong type or length or a value is out of range.
bool paramsFromFields(nvinfer1::PluginFieldCollection const& fc, VdetDecodeNmsParams& params,
                      std::string& error) noexcept;

// The defaults of vdet.core.contract (kernels/vdet_contract.h, generated from it).
VdetDecodeNmsParams defaultParams() noexcept;

}  // namespace vdet

// The library is built with hidden visibility; these are its only exported symbols.
// (TensorRT's TENSORRTAPI exports only when TENSORRT_BUILD_LIB is defined.)
#define VDET_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" {
// TensorRT's plugin-library entry points (IPluginRegistry::loadLibrary, trtexec
// --dynamicPlugins).
VDET_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
VDET_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder);
}

#endif  // VDET_PLUGIN_H
