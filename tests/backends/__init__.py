"""The built-in backends, each against the goldens."""
