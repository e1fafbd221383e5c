"""FlashDSA benchmark suite (entry point: ``python bench/run.py``; see docs/benchmarks.md).

One run measures the machine ceilings, every FlashDSA kernel, the whole DSA layer forward +
backward (with and without IndexShare) and the baselines (dense cuDNN SDPA, unfused PyTorch DSA),
and writes a JSON of all numbers, a Markdown report and PNG plots.
"""
