"""toolreg's benchmarks: `python -m benchmarks [--quick] [--only NAME[,NAME]] [--regime R]`.

Each `bench_*.py` module has `run(quick: bool)`, which measures and returns its rows; `__main__`
runs it in each regime (`_regime`: `same`, the process on one CPU; `cross`, callers on one CPU
and workers on the other; `free`, no pinning; by default same and cross, with `--quick` same
only) and ends with a summary of every row that carries a target. `_harness.py` holds the
shared timing (interleaved rounds, medians of per-round ratios), warm-up, wake-up counting and
table helpers. Benchmarks print figures against baselines measured in the same run; they never
fail on a missed target.
"""
