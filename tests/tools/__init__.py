"""The tools: selftest, lens, attribute, generate, serve."""
