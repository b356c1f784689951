"""Discover backends through the `parity.backends` entry-point group (built-in ones included).

Loading a backend runs its code (the import, the class body, `__init__`): every step goes through
`harness.guard.call_backend`, so a plugin that raises, exits or declares nonsense is one line
naming it (exit 2). What a backend declares is checked here, once: its name, its precisions (a
non-empty subset of fp32/fp64, no repeats), `requires` (module names), `description` and
`install_hint` (strings). `supported_taps` and `missing_dependencies` are checked where they are
called (`checked_supported_taps`, `checked_missing_dependencies`).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from harness.backends.base import PRECISIONS, Backend
from harness.errors import BackendFailed, ParityError
from harness.guard import call_backend, one_line

if TYPE_CHECKING:
    from harness.fixture import Fixture

GROUP = "parity.backends"


def backend_entry_points() -> dict[str, EntryPoint]:
    """Every registered backend's entry point by name, sorted by name (importing nothing)."""
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    return dict(sorted(eps.items()))


def load_backend(name: str) -> Backend:
    """Instantiate a registered backend by name; ParityError (exit 2) if unknown, broken or ill-declared."""
    eps = backend_entry_points()
    if name not in eps:
        known = ", ".join(eps) or "none"
        raise ParityError(f"unknown backend {one_line(name)!r} (registered: {known})")
    where = eps[name].value
    cls = call_backend(name, f"import ({where})", eps[name].load)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendFailed(f"backend {name!r} ({where}) is not a harness.backends.base.Backend subclass")
    backend = call_backend(name, "__init__", cls)
    if not isinstance(backend, Backend):
        raise BackendFailed(f"backend {name!r} ({where}): its class did not make a Backend instance")
    call_backend(name, "its declarations", lambda: check_declarations(backend, name))
    return backend


def check_declarations(backend: Backend, name: str) -> None:
    """Name, precisions, requires, description and install_hint, or BackendFailed saying which is wrong."""
    declared = backend.name
    if not isinstance(declared, str) or declared != name:
        raise BackendFailed(f"backend registered as {name!r} calls itself {one_line(repr(declared))}")
    precisions = backend.precisions
    if not isinstance(precisions, tuple | list) or not all(isinstance(p, str) for p in precisions):
        raise BackendFailed(f"backend {name!r}: precisions must be a tuple of 'fp32'/'fp64', "
                            f"got {one_line(repr(precisions))[:80]}")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise BackendFailed(f"backend {name!r} declares unknown precision {one_line(unknown[0])!r} "
                            f"(known: {', '.join(PRECISIONS)})")
    if not precisions or len(set(precisions)) != len(precisions):
        raise BackendFailed(f"backend {name!r}: precisions must be a non-empty subset of ('fp32', 'fp64') "
                            f"without repeats, got {tuple(precisions)}")
    requires = backend.requires
    if not isinstance(requires, tuple | list) or not all(isinstance(m, str) and m for m in requires):
        raise BackendFailed(f"backend {name!r}: requires must be a tuple of module names, "
                            f"got {one_line(repr(requires))[:80]}")
    for attr in ("description", "install_hint"):
        if not isinstance(getattr(backend, attr), str):
            raise BackendFailed(f"backend {name!r}: {attr} must be a string")


def checked_missing_dependencies(backend: Backend) -> list[str]:
    """`backend.missing_dependencies()`, guarded: a list of strings, or BackendFailed."""
    missing = call_backend(backend.name, "missing_dependencies", backend.missing_dependencies)
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        raise BackendFailed(f"backend {backend.name!r}: missing_dependencies returned "
                            f"{one_line(repr(missing))[:80]}, expected a list of strings")
    return [one_line(m) for m in missing]


def checked_supported_taps(backend: Backend, fixture: Fixture) -> list[str]:
    """`backend.supported_taps(fixture)`, guarded: a non-empty list of the fixture's taps, no repeats."""
    taps = call_backend(backend.name, "supported_taps", lambda: backend.supported_taps(fixture.for_backend()))
    if type(taps) is not list or not all(type(t) is str for t in taps):
        raise BackendFailed(f"backend {backend.name!r}: supported_taps returned {one_line(repr(taps))[:80]}, "
                            "expected a list of tap names")
    unknown = [t for t in taps if t not in fixture.tap_names]
    if unknown:
        only = "only unknown taps" if len(unknown) == len(taps) else f"{len(unknown)} unknown tap(s)"
        raise BackendFailed(f"backend {backend.name!r}: supported_taps declares {only}, e.g. "
                            f"{one_line(unknown[0])!r} (not a tap of this fixture)")
    if not taps:
        raise BackendFailed(f"backend {backend.name!r}: supported_taps is empty (nothing to compare)")
    if len(set(taps)) != len(taps):
        raise BackendFailed(f"backend {backend.name!r}: supported_taps repeats a tap")
    return list(taps)


def load_backends(names: list[str] | None = None) -> list[Backend]:
    """The named backends, in the order given, or every registered backend."""
    return [load_backend(n) for n in (names if names is not None else list(backend_entry_points()))]
