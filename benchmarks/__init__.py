"""Developer benchmarks, run from the repository root as ``python -m benchmarks.NAME``; see README.md."""
