"""Generating worlds and logs for the demo, the tests and the benchmarks."""
