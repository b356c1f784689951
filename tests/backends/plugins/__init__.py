"""Backends from outside: the plugin contract, its kit, broken and hostile plugins, the boundary."""
