"""Making fixtures: export, presets, the stress fixture, the Hugging Face import, writers and the high-precision truth."""
