"""The project as a whole: architecture, CI, install, docs and names, nox sessions, benchmarks."""
