"""Benchmark helpers: the dense textbook baseline, the memory-read floor, timing and output.

Nothing here is imported by the library itself; ``portable-verify bench`` composes these parts.
"""
