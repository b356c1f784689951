"""Backends: one file each, registered through the `parity.backends` entry-point group."""
