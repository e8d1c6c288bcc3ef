"""vdet's CUDA kernels and the CUDA plumbing around them: the kernels' sources (`kernels/`, package
data, compiled at run time by NVRTC: `launch`), their typed calls (`ops`, `layer_ops`), the
generated header of the shared numbers (`contract_header`), the CUDA-graph capture guard, the
CUDA stream scope, how host threads wait for a GPU, and the CUDA runtime calls of the TensorRT
path (`runtime`). Tensors come from the caller; this package imports only core."""
