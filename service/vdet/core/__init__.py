"""What every other package shares and nothing of vdet's: the value types that travel through the
pipeline (`types`), the numbers the CPU reference, the kernels and the TensorRT plugin must agree
on (`contract`), a model file's signature (`model`), plane geometry (`geometry`), the bundled
files (`assets`), measured rates (`rates`) and credentials hidden from text (`redact`).
Imports no other package of vdet."""
