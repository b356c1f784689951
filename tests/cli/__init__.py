"""The parity command, the Python API, the pytest plugin and the one gate they share."""
