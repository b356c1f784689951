"""The browser family: one Chromium driver and the backends that run in it."""
