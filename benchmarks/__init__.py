"""Benchmarks of scalelab against plain PyTorch: `python -m benchmarks --help` (make bench)."""
