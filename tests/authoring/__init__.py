"""Writing fixtures: export, presets, the stress fixture, publishable fixtures."""
