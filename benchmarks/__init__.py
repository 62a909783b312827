"""Benchmarks: `python -m benchmarks` (make bench) runs every bench_*.py module's main()."""
