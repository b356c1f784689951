"""Rendering a report: the console text, JUnit, Markdown, plots and the decoding view. Views never run anything."""
