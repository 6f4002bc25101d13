"""Benchmarks of the running service."""
