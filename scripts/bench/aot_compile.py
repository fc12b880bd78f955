"""Every Triton kernel variant compiled ahead of time for a GPU target, registers and spills.

Why: register pressure, spills and float64 arithmetic decide the kernels' speed on the GPU, and
Triton compiles cubins without one (its bundled ptxas). Run it with the Triton of the GPU run of
record (3.6 on the lent H200) and with CI's:

    PYTHONPATH=. python scripts/bench/aot_compile.py [--arch 90] [--quick]

One line per variant: kernel, registers, spill-store bytes, float64 in the TTIR, constexprs.
"""

from __future__ import annotations

import argparse

import triton

from portable_verify.testing import aot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=aot.H200[1], help="compute capability")
    parser.add_argument("--quick", action="store_true", help="the CI test's subset only")
    args = parser.parse_args()
    target = ("cuda", args.arch, 32)
    variants = aot.compile_variants(aot.chain_calls(full=not args.quick),
                                    [] if args.quick else aot.tree_calls(), target)
    print(f"Triton {triton.__version__}, target {target}: {len(variants)} variants")
    aot.report(variants)


if __name__ == "__main__":
    main()
