"""Datasets: the built-in procedural one, and the on-disk benchmarks decoded into uint8 caches."""
