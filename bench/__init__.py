"""StoneMQ's benchmark suite: workloads, baselines and the report (``python -m bench``).

Not part of the test suite (pytest only collects ``tests/``). See the README's "Benchmarks"
section and ``docs/benchmarks.md``.
"""
