"""parity's pytest plugin: a `parity` fixture, so a suite checks its own port in one line.

Registered through the `pytest11` entry point (pyproject.toml), so installing parity is enough::

    def test_my_port(parity):
        parity.assert_agrees(MyBackend(), precision="fp64")

The fixture is `parity_harness.api` bound to one fixture directory: `--parity-fixture DIR` on the command
line (relative to where pytest was started), else the ini option `parity_fixture` (relative to the
ini file), else the toy fixture parity ships. Importing this module imports nothing of parity's
beyond the package itself (no numpy, no torch): the API is imported when a test first asks for
`parity`. A `ParityError` (a broken fixture, an unknown backend, a backend that crashed) fails the
test with its one line and no traceback; a disagreement is a `ParityAssertionError` naming the tap.
The `parity` fixture is shared by every test of the session, so it is read-only, as the `Fixture` it holds
is: a test that edits it (loosens a tolerance, cuts the cases) gets an AttributeError or TypeError and
cannot change what another test is judged against. See docs/api.md.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator, Mapping, Sequence

    from parity_harness._compare.report import Report
    from parity_harness._fixture.fixture import Fixture
    from parity_harness.api import BackendLike, Format, PrecisionLike

OPTION = "--parity-fixture"
INI = "parity_fixture"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity", "parity (tap-by-tap agreement of transformer implementations)")
    group.addoption(OPTION, dest="parity_fixture", metavar="DIR", default=None,
                    help="the fixture directory the `parity` fixture compares against (default: the ini option "
                         f"{INI}, else parity's toy fixture)")
    parser.addini(INI, "the fixture directory of the `parity` fixture, relative to the ini file "
                       "(default: parity's toy fixture)", default="")


def fixture_dir(config: pytest.Config) -> Path | None:
    """The chosen fixture directory, absolute; None for the toy."""
    given = config.getoption("parity_fixture")
    if given:
        return Path(config.invocation_params.dir, given)
    ini = str(config.getini(INI) or "")
    if ini:
        base = config.inipath.parent if config.inipath is not None else config.rootpath
        return Path(base, ini)
    return None


class Parity:
    """What the `parity` fixture gives a test: `parity_harness.api`, bound to the session's fixture.

    `ParityAssertionError` and `ParityError` are attributes too, for `pytest.raises`. Read-only: one object
    serves the whole session, so no test may rebind what the next one uses.
    """

    path: Path | None
    _fixture: Fixture | None

    def __init__(self, path: Path | None) -> None:
        from parity_harness import api

        set_attr = object.__setattr__
        set_attr(self, "path", path)
        set_attr(self, "ParityAssertionError", api.ParityAssertionError)
        set_attr(self, "ParityError", api.ParityError)
        set_attr(self, "_fixture", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"parity.{name} is read-only: the `parity` fixture is shared by every test of the "
                             "session, so no test may change what another is judged against")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    @property
    def fixture(self) -> Fixture:
        """The session's fixture, loaded and checked once (on first use)."""
        __tracebackhide__ = True
        from parity_harness import api

        if self._fixture is None:
            try:
                object.__setattr__(self, "_fixture", api.load(self.path))
            except api.ParityError as exc:
                error = exc
            else:
                return self._fixture  # type: ignore[return-value]
            _fail(error)
        return self._fixture

    def assert_agrees(self, backend: BackendLike | Sequence[BackendLike] | Report | None,
                      precision: PrecisionLike = "all", *, decoding: bool = True, grad: bool = False,
                      onnx: str | os.PathLike[str] | None = None,
                      onnx_map: str | os.PathLike[str] | Mapping[str, str] | None = None) -> Report:
        """`parity_harness.api.assert_agrees` on the session's fixture (a Report: that report judged); `onnx`: a
        user's ONNX graph too (alone with `backend=None`)."""
        __tracebackhide__ = True
        from parity_harness import api

        fixture = self.fixture
        try:
            return api.assert_agrees(backend, fixture, precision, decoding=decoding, grad=grad, onnx=onnx,
                                     onnx_map=onnx_map)
        except api.ParityError as exc:
            error = exc
        _fail(error)  # outside the except: no "during handling of the above exception"

    def run(self, backends: BackendLike | Sequence[BackendLike] | None, precisions: PrecisionLike = "all", *,
            decoding: bool = True, budget: bool = False, keep_outputs: bool = False, grad: bool = False,
            onnx: str | os.PathLike[str] | None = None,
            onnx_map: str | os.PathLike[str] | Mapping[str, str] | None = None) -> Report:
        """`parity_harness.api.run` on the session's fixture: a Report, truthy when it passes; `onnx`: a user's ONNX
        graph too (alone with `backends=None`)."""
        __tracebackhide__ = True
        from parity_harness import api
        from parity_harness.api import run as run_backends  # a name apart from the backend contract's `run`

        fixture = self.fixture
        try:
            return run_backends(backends, fixture, precisions, decoding=decoding, budget=budget,
                                keep_outputs=keep_outputs, grad=grad, onnx=onnx, onnx_map=onnx_map)
        except api.ParityError as exc:
            error = exc
        _fail(error)  # outside the except: no "during handling of the above exception"

    def compare_dumps(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                      budget: bool = False) -> Report:
        """`parity_harness.api.compare_dumps` on the session's fixture."""
        __tracebackhide__ = True
        from parity_harness import api

        fixture = self.fixture
        try:
            return api.compare_dumps(paths, fixture, budget=budget)
        except api.ParityError as exc:
            error = exc
        _fail(error)  # outside the except: no "during handling of the above exception"

    def render(self, report: Report, fmt: Format = "text", path: str | os.PathLike[str] | None = None, *,
               verbose: bool = False) -> str:
        """`parity_harness.api.render`."""
        __tracebackhide__ = True
        from parity_harness import api

        try:
            return api.render(report, fmt, path, verbose=verbose)
        except api.ParityError as exc:
            error = exc
        _fail(error)  # outside the except: no "during handling of the above exception"


def _fail(exc: Exception) -> NoReturn:
    """A ParityError fails the test with its one line (no traceback), as the CLI prints it."""
    __tracebackhide__ = True
    pytest.fail(f"parity: error: {exc}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that failed with a ParityAssertionError: pytest's short summary line (cut at the terminal's edge)
    leads with the tap ("TAP: BACKEND fp64 vs fp64, case C, index [i, j]: got A, expected B, ..."), the message's
    first line without its "first divergence at ", not with the exception's dotted name, which fills 80
    columns before the tap."""
    report = yield
    excinfo = call.excinfo
    if report.failed and excinfo is not None and type(excinfo.value).__name__ == "ParityAssertionError":
        crash = getattr(report.longrepr, "reprcrash", None)
        first = next((line for line in str(excinfo.value).splitlines() if line.strip()), "")
        if crash is not None and first:
            with contextlib.suppress(AttributeError):
                crash.message = first.removeprefix("first divergence at ")
    return report


@pytest.fixture(scope="session")
def parity(pytestconfig: pytest.Config) -> Parity:
    """parity's API bound to the fixture of `--parity-fixture DIR` / ini `parity_fixture` / the toy."""
    helper = Parity(fixture_dir(pytestconfig))
    helper.fixture  # noqa: B018  load it now: a broken fixture is an error at setup, one line
    return helper
