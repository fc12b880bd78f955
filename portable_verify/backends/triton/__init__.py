"""Triton kernels for CUDA and XPU (and the interpreter on CPU): chains, block verification
and trees."""
