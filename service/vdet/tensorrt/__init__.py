"""TensorRT engines: building a plan from an ONNX (`build`), the engine cache and its manifests
(`cache`), full TensorRT or TensorRT for RTX (`library`), the ONNX surgery that adds the decode +
NMS plugin node (`surgery`) and finding and loading the plugin library (`plugin_library`).
Serving only deserializes what was built (vdet.inference.backends.tensorrt)."""
