"""Discover backends through the `parity.backends` entry-point group (built-in ones included)."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from harness.backends.base import Backend
from harness.errors import ParityError

GROUP = "parity.backends"


def backend_entry_points() -> dict[str, EntryPoint]:
    """Every registered backend's entry point by name, sorted by name (importing nothing)."""
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    return dict(sorted(eps.items()))


def load_backend(name: str) -> Backend:
    """Instantiate a registered backend by name; ParityError (exit 2) if unknown or broken."""
    eps = backend_entry_points()
    if name not in eps:
        known = ", ".join(eps) or "none"
        raise ParityError(f"unknown backend {name!r} (registered: {known})")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a plugin that fails to import is the plugin's bug; say which one
        raise ParityError(f"backend {name!r} ({eps[name].value}) failed to load: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ParityError(f"backend {name!r} ({eps[name].value}) is not a harness.backends.base.Backend subclass")
    backend = cls()
    if backend.name != name:
        raise ParityError(f"backend registered as {name!r} calls itself {backend.name!r}")
    return backend


def load_backends(names: list[str] | None = None) -> list[Backend]:
    """The named backends, in the order given, or every registered backend."""
    return [load_backend(n) for n in (names if names is not None else list(backend_entry_points()))]
