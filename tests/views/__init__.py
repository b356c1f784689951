"""The views of a run: console, JSON, JUnit, Markdown, plots."""
