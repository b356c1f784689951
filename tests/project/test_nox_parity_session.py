"""`nox -s parity` runs every fixture and reports each, then fails naming those that did not pass.

The session's function runs with a fake `session` that records its commands and makes `parity run` exit
with a chosen code, as nox's `session.run` does: a non-zero exit raises `nox.command.CommandFailed`
carrying the code. The noxfile is loaded with a small stand-in for the `nox` module, so the test needs
no nox installed (CI installs it on its own, not in the project's environment).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


class CommandFailed(Exception):
    """nox.command.CommandFailed's shape: a reason and the command's exit code."""

    def __init__(self, reason: str | None = None, *, return_code: int | None = None) -> None:
        super().__init__(reason)
        self.return_code = return_code


class SessionError(Exception):
    """What the fake session's `error` raises (nox's raises its own _SessionQuit)."""


def _fake_nox() -> types.ModuleType:
    nox = types.ModuleType("nox")
    command = types.ModuleType("nox.command")
    command.CommandFailed = CommandFailed  # type: ignore[attr-defined]
    nox.command = command  # type: ignore[attr-defined]
    nox.options = types.SimpleNamespace()  # type: ignore[attr-defined]
    nox.Session = object  # type: ignore[attr-defined]

    def session(*args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

    nox.session = session  # type: ignore[attr-defined]
    return nox


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    fake = _fake_nox()
    monkeypatch.setitem(sys.modules, "nox", fake)
    monkeypatch.setitem(sys.modules, "nox.command", fake.command)
    spec = importlib.util.spec_from_file_location("_noxfile_under_test", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


class FakeSession:
    """Records every `run`; `parity run` on a fixture exits with the code given for it (0 by default)."""

    def __init__(self, posargs: list[str], codes: dict[str, int]) -> None:
        self.posargs = posargs
        self.codes = codes
        self.runs: list[tuple[str, ...]] = []
        self.errors: list[str] = []

    def install(self, *args: str, **kwargs: Any) -> None:
        pass

    def run(self, *args: str, **kwargs: Any) -> bool:
        self.runs.append(args)
        if args[:2] != ("parity", "run"):
            return True
        fixture = args[args.index("--fixture") + 1] if "--fixture" in args else "fixtures/toy"
        code = self.codes.get(fixture, 0)
        if code not in kwargs.get("success_codes", [0]):
            raise CommandFailed(f"exit code {code}", return_code=code)
        return True

    def error(self, *args: Any) -> None:
        self.errors.append(" ".join(map(str, args)))
        raise SessionError(*args)


def _parity_runs(session: FakeSession) -> list[tuple[str, ...]]:
    return [r for r in session.runs if r[:2] == ("parity", "run")]


def test_stress_fixture_runs_after_the_toy_fails(noxfile: types.ModuleType) -> None:
    session = FakeSession(["--json", "r.json"], {"fixtures/toy": 1})
    with pytest.raises(SessionError):
        noxfile.parity(session)
    runs = _parity_runs(session)
    assert len(runs) == 4, runs  # the stress fixture ran (and wrote its tagged report) after the toy failed
    assert "fixtures/toy-llama" in runs[2] and "r.toy-llama.json" in runs[2]  # and the Llama family's toy
    assert _backends_arg(runs[3]) == ["llama-cpp"] and "r.toy-llama-llama-cpp.json" in runs[3]  # llama.cpp on it
    assert "fixtures/toy-stress" in runs[1] and "r.toy-stress.json" in runs[1]
    assert session.errors == ["parity failed on fixtures/toy (exit 1)"]


def test_every_failing_fixture_is_named_with_its_exit_code(noxfile: types.ModuleType) -> None:
    session = FakeSession([], {"fixtures/toy": 1, "fixtures/toy-stress": 2})
    with pytest.raises(SessionError):
        noxfile.parity(session)
    assert len(_parity_runs(session)) == 4
    assert session.errors == ["parity failed on fixtures/toy (exit 1), fixtures/toy-stress (exit 2)"]


def test_all_agree_is_no_error(noxfile: types.ModuleType) -> None:
    session = FakeSession([], {})
    noxfile.parity(session)
    assert len(_parity_runs(session)) == 4 and session.errors == []


def test_a_named_fixture_runs_alone(noxfile: types.ModuleType) -> None:
    session = FakeSession(["--fixture", "fixtures/toy-stress"], {"fixtures/toy-stress": 1})
    with pytest.raises(SessionError):
        noxfile.parity(session)
    assert len(_parity_runs(session)) == 1
    assert session.errors == ["parity failed on fixtures/toy-stress (exit 1)"]



def _backends_arg(run: tuple[str, ...]) -> list[str]:
    return run[run.index("--backends") + 1].split(",")


def test_without_browser_names_every_other_backend_and_says_why(noxfile: types.ModuleType) -> None:
    session = FakeSession(["--without-browser=Chromium from npm is x86-64 Linux only", "--json", "r.json"], {})
    logged: list[str] = []
    session.log = lambda *a: logged.append(" ".join(map(str, a)))  # type: ignore[attr-defined]
    noxfile.parity(session)
    runs = _parity_runs(session)
    assert len(runs) == 4 and _backends_arg(runs[3]) == ["llama-cpp"]  # llama.cpp on the Llama toy: no browser
    runs = runs[:3]
    browser = set(noxfile.BROWSER_BACKENDS)
    assert browser == {"typescript-browser", "onnxruntime-web", "onnxruntime-web-optimized", "onnxruntime-webgpu"}
    for run in runs:
        assert not any(a.startswith("--without-browser") for a in run)
        named = _backends_arg(run)
        assert "numpy" in named and "pytorch" in named and not browser & set(named), named
    assert "r.toy-stress.json" in runs[1]
    assert len(logged) == 1 and "Chromium from npm is x86-64 Linux only" in logged[0]
    assert all(name in logged[0] for name in browser)


def test_without_browser_filters_the_backends_named(noxfile: types.ModuleType) -> None:
    session = FakeSession(["--backends", "numpy,typescript-browser", "--without-browser=no Chromium here"], {})
    session.log = lambda *a: None  # type: ignore[attr-defined]
    noxfile.parity(session)
    runs = _parity_runs(session)
    assert len(runs) == 3 and all(_backends_arg(run) == ["numpy"] for run in runs)  # named: no llama.cpp run


def test_without_browser_needs_a_reason(noxfile: types.ModuleType) -> None:
    session = FakeSession(["--without-browser"], {})
    with pytest.raises(SessionError):
        noxfile.parity(session)
    assert _parity_runs(session) == [] and "REASON" in session.errors[0]
