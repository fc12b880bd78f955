"""The compiled CPU kernels (numba): chain, block and tree kernels, their float32 row
primitives and the host runtime (threads, views, the options record)."""
