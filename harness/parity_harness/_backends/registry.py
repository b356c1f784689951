"""Discover backends through the `parity.backends` entry-point group (built-in ones included).

Loading a backend runs its code (the import, the class body, `__init__`): every step goes through
`parity_harness._backends.guard.call_backend`, so a plugin that raises, exits or declares nonsense is one line
naming it (exit 2). What it hands out is a `GuardedBackend` (parity_harness/_backends/boundary.py), the one
boundary every later call into the backend's code goes through, and where the contract's rules live.

A plugin written for the previous layout imports modules that moved (`harness.*`, `reference.*`): its
ModuleNotFoundError is one line naming the module to import instead (`MOVED`, `moved_module_hint`).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from parity_harness._backends.base import Backend
from parity_harness._backends.boundary import GuardedBackend
from parity_harness._backends.guard import call_backend, one_line
from parity_harness._core.errors import BackendFailed, ParityError

GROUP = "parity.backends"

# The top-level modules of the previous layout (before parity_harness/parity_reference) -> what replaced them,
# longest prefix first. A plugin imports a backend's base classes, errors and helpers from parity_harness.plugin.
MOVED: tuple[tuple[str, str], ...] = (
    ("harness.api", "parity_harness.api (the Python API)"),
    ("harness.pytest_plugin", "parity_harness.pytest_plugin (the pytest fixture)"),
    ("harness", "parity_harness.plugin (a backend's base classes, errors and helpers: Backend, Fixture, "
                "Precision, BackendOutput, ParityError, ...)"),
    ("reference", "parity_reference (the reference model: parity_reference.numpy_model, parity_reference.model, "
                  "parity_reference.config, ...)"),
)


def moved_module_hint(missing: str | None) -> str:
    """For the module a ModuleNotFoundError names: '' unless it is one of the previous layout's (`MOVED`), else
    "'harness' moved: import parity_harness.plugin (...) instead (docs/adding-a-backend.md)"."""
    if not isinstance(missing, str):
        return ""
    for old, new in MOVED:
        if missing == old or missing.startswith(old + "."):
            return (f"{missing!r} is a module of parity's previous layout: import {new} instead "
                    "(docs/adding-a-backend.md, 'A plugin written for the previous layout')")
    return ""


def _import(name: str, ep: EntryPoint) -> object:
    """`ep.load()`; a module of the previous layout it imports is one line naming the replacement."""
    try:
        return ep.load()
    except ModuleNotFoundError as exc:
        hint = moved_module_hint(exc.name)
        if not hint:
            raise
        raise BackendFailed(f"backend {name!r} ({ep.value}) cannot be imported: No module named "
                            f"{exc.name!r}; {hint}") from None


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
    ep = eps[name]
    cls = call_backend(name, f"import ({where})", lambda: _import(name, ep))
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendFailed(f"backend {name!r} ({where}) is not a parity_harness._backends.base.Backend subclass")
    backend = call_backend(name, "__init__", cls)
    if not isinstance(backend, Backend):
        raise BackendFailed(f"backend {name!r} ({where}): its class did not make a Backend instance")
    return GuardedBackend.wrap(backend, name)


def load_backends(names: list[str] | None = None) -> list[GuardedBackend]:
    """The named backends, in the order given, or every registered backend."""
    return [load_backend(n) for n in (names if names is not None else list(backend_entry_points()))]
