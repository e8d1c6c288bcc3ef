"""The GPU side of a process: one `GpuDevice` per GPU (NVDEC readers, a CUDA graph per stream and
input shape, network replicas: `devices`), the graphs themselves (`graphs`), the per-frame GPU ops
(vdet's kernels or torch's reference: `frame_ops`), cross-stream batching (`batcher`), which GPU
runs which stream (`placement`), which input shape a frame runs at (`input_shapes`) and the GIL
switch interval of a many-stream process (`gil`). It never decides whether to use a GPU."""
