"""fairq's tests; ``tests.support`` holds the helpers they share with ``benchmarks/``."""
