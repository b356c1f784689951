"""The Node family: the pip-installed Node runtime and the TypeScript backend."""
