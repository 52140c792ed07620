"""Benchmarks: scripts that measure, never tests that assert. Results live in docs/benchmarks.md."""
