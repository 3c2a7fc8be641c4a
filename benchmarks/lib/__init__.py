"""Code the benchmarks share that is not part of omrl: comparing learning methods (compare) and its figures."""
