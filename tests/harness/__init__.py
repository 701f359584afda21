"""Shared test scenarios for tests and benchmarks: a standalone cluster, a frozen executor, sessions."""
