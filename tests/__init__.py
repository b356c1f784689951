"""parity's test suite."""
