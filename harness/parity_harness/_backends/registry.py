"""Discover backends through the `parity.backends` entry-point group (built-in ones included).

Loading a backend runs its code (the import, the class body, `__init__`): every step goes through
`parity_harness._backends.guard.call_backend`, so a plugin that raises, exits or declares nonsense is one line
naming it (exit 2). What it hands out is a `GuardedBackend` (parity_harness/_backends/boundary.py), the one
boundary every later call into the backend's code goes through, and where the contract's rules live.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from parity_harness._backends.base import Backend
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.guard import call_backend, one_line
from parity_harness._core.errors import BackendFailed, ParityError

GROUP = "parity.backends"


def backend_entry_points() -> dict[str, EntryPoint]:
    """Every registered backend's entry point by name, sorted by name (importing nothing)."""
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    return dict(sorted(eps.items()))


def load_backend(name: str) -> GuardedBackend:
    """Instantiate a registered backend by name, wrapped; ParityError (exit 2) if unknown, broken or ill-declared."""
    eps = backend_entry_points()
    if name not in eps:
        known = ", ".join(eps) or "none"
        raise ParityError(f"unknown backend {one_line(name)!r} (registered: {known})")
    where = eps[name].value
    cls = call_backend(name, f"import ({where})", eps[name].load)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendFailed(f"backend {name!r} ({where}) is not a parity_harness._backends.base.Backend subclass")
    backend = call_backend(name, "__init__", cls)
    if not isinstance(backend, Backend):
        raise BackendFailed(f"backend {name!r} ({where}): its class did not make a Backend instance")
    return GuardedBackend.wrap(backend, name)


def load_backends(names: list[str] | None = None) -> list[GuardedBackend]:
    """The named backends, in the order given, or every registered backend."""
    return [load_backend(n) for n in (names if names is not None else list(backend_entry_points()))]
