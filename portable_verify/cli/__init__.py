"""Command-line interface: ``portable-verify {bench,info,conformance,e2e,gpu-check}``."""
