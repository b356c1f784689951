"""Benchmarks that print numbers (no pass/fail on time): `nox -s bench` or `python -m benchmarks.bench`."""
