"""parity's exceptions: every problem that is not a numerical verdict (the CLI exits 2 on any of them)."""

from __future__ import annotations


class ParityError(Exception):
    """A user-facing problem: printed as one line, exit code 2 (cli/exit_codes.py), no traceback.

    Every subclass defined in a module of parity itself is one of parity's own errors (`is_own_error`): its
    text was written by parity. A subclass a plugin defines is not.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        module = getattr(cls, "__module__", "")
        if isinstance(module, str) and module.startswith("parity_harness.") and module != "parity_harness.plugin":
            _OWN.add(cls)


_OWN: set[type[BaseException]] = {ParityError}


def is_own_error(exc: BaseException) -> bool:
    """The one definition of "parity's own error": an instance of exactly ParityError or of a subclass defined in
    parity's modules (FixtureError, DumpError, MergeError, ...), never a plugin's subclass. The boundary lets
    these through as they are and the CLI prints their text at full length (_backends/guard.py, _cli/main.py)."""
    return type(exc) in _OWN


class FixtureError(ParityError):
    """A fixture that cannot be trusted: unreadable, wrong hash, wrong shape, unknown version."""


class BackendUnavailable(ParityError):
    """A backend asked for by name whose dependencies are missing (the message says how to install them)."""


class BackendFailed(ParityError):
    """A backend that crashed, hung or returned something unusable (not a numerical disagreement)."""


class BackendMisbehaved(BackendFailed):
    """Raised by the harness about a backend: it crashed (raised something not parity's), or what it returned
    breaks the contract (_backends/boundary.py). A ParityError the backend raises itself stays its own.

    `detail`: for a crash, the backend's full traceback (`parity run -v` prints it, sanitized); "" otherwise."""

    detail: str = ""
