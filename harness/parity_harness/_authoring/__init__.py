"""Making fixtures: export, presets, the stress fixture, the Hugging Face import, writers, the high-precision truth."""
