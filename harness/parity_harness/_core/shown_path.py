"""A fixture path as a file parity writes names it: parity's own fixtures by name, never by its installation's path.

A report names the fixture the user pointed at, as given (`--fixture ../my-port/fixture` stays so). The
default fixture is not one the user pointed at: it lives in parity's installation (the checkout's
`fixtures/toy`, or the wheel's copy under site-packages), and its absolute path would publish the
directory layout of the machine that ran parity in every JSON or Markdown report (issue 43). So a path
that is one of parity's own fixtures (`resources.toy_fixture_dir`, `resources.stress_fixture_dir`) is shown
as `fixtures/toy` / `fixtures/toy-stress`, and any other path inside parity's package directory as
`<parity>/RELATIVE`. Only for display: the Report keeps the real path (the diagnosis reads the manifest there).
"""

from __future__ import annotations

import os
from pathlib import Path

from parity_harness._core.resources import PACKAGE_DIR, stress_fixture_dir, toy_fixture_dir

INSTALLED = "<parity>"  # what stands for parity's package directory in a shown path


def shown_fixture(path: str | Path) -> str:
    """`path` as a written file may name it (the module docstring); as given when it is not parity's own."""
    text = str(path)
    if not text:
        return text
    try:
        real = os.path.realpath(text)
    except (OSError, ValueError):  # a name the file system cannot hold (a lone surrogate, NUL): not parity's own
        return text
    own = {os.path.realpath(toy_fixture_dir()): "fixtures/toy",
           os.path.realpath(stress_fixture_dir()): "fixtures/toy-stress"}
    if real in own:
        return own[real]
    package = os.path.realpath(PACKAGE_DIR)
    if real == package or real.startswith(package + os.sep):
        return Path(INSTALLED, os.path.relpath(real, package)).as_posix()
    return text


__all__ = ["INSTALLED", "shown_fixture"]
