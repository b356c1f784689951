"""Commands beyond the check: selftest and its mutants, lens, generate, serve and check-backend."""
