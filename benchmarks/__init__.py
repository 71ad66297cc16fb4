"""toolreg's benchmarks: `python -m benchmarks [--quick] [--only NAME]`.

Each `bench_*.py` module has `run(quick: bool)`, which measures and returns its rows (and may print
its own table); `_harness.py` holds the shared timing, memory and table helpers. Benchmarks print
figures against baselines measured in the same run; they never fail on a missed target.
"""
