"""Bad backends: a backend that misbehaves is reported in one line naming the problem, never a pass.

tests/cli/test_bad_input.py breaks the fixture and the arguments; this file breaks the backend.
The Python fakes below are registered as `parity.backends` entry points for the duration of a
test (the registry is patched in-process, so no package install is needed) and driven through
the real `parity run` code path (`parity_harness._cli.main.main`): registry loading, the runner, the report and
the exit code. A numerical disagreement (NaN, wrong shape, missing tap, wrong dtype) exits 1 and
names the tap in the report; a backend that cannot be used (not a dict, a missing case, raises)
exits 2 with a single `parity: error:` line. The typescript backend's Node failures (missing,
crashing, hanging) run in a subprocess with PARITY_NODE pointing at a stand-in script.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import parity_harness._backends.registry
import parity_harness._cli.main
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._fixture.fixture import Fixture
from tests.helpers import assert_one_error_line, assert_one_line_error, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

CASE = "grammar_1"  # the case every fake breaks
TAP = "blocks.0.mlp.hook_post"  # the tap it breaks


class _GoldenCopy(Backend):
    """Returns a copy of the float64 golden (a perfect backend) after `damage` changes it."""

    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)

    def damage(self, out: BackendOutput) -> object:
        return out

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        golden = fixture.golden(precision)
        out = {case: {tap: a.copy() for tap, a in taps.items()} for case, taps in golden.items()}
        return self.damage(out)  # type: ignore[return-value]  # deliberately not always a BackendOutput


class PerfectBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-perfect"


class NaNBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-nan"

    def damage(self, out: BackendOutput) -> object:
        out[CASE][TAP][2, 3] = np.nan
        return out


class WrongShapeBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-shape"

    def damage(self, out: BackendOutput) -> object:
        out[CASE][TAP] = out[CASE][TAP].T.copy()  # [7, 32] -> [32, 7]
        return out


class WrongDtypeBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-dtype"

    def damage(self, out: BackendOutput) -> object:
        out[CASE][TAP] = out[CASE][TAP].astype(np.float32)
        return out


class MissingTapBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-missing-tap"

    def damage(self, out: BackendOutput) -> object:
        del out[CASE][TAP]
        return out


class MissingCaseBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-missing-case"

    def damage(self, out: BackendOutput) -> object:
        del out[CASE]
        return out


class NotADictBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-list"

    def damage(self, out: BackendOutput) -> object:
        return list(out.values())


class TapsNotADictBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-taps-list"

    def damage(self, out: BackendOutput) -> object:
        return {case: list(taps.values()) for case, taps in out.items()}


class RaisingBackend(_GoldenCopy):
    name: ClassVar[str] = "fake-raises"

    def damage(self, out: BackendOutput) -> object:
        raise RuntimeError("index 9 is out of bounds for axis 0 with size 8\n  (a second line that must not show)")


FAKES: list[type[_GoldenCopy]] = [PerfectBackend, NaNBackend, WrongShapeBackend, WrongDtypeBackend,
                                  MissingTapBackend, MissingCaseBackend, NotADictBackend, TapsNotADictBackend,
                                  RaisingBackend]


@pytest.fixture
def run_fake(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """`parity run [OPTIONS] --backends NAME -q` in-process, with the fakes registered as entry points."""
    real = parity_harness._backends.registry.backend_entry_points()
    group = parity_harness._backends.registry.GROUP
    fakes = {cls.name: EntryPoint(cls.name, f"{__name__}:{cls.__name__}", group) for cls in FAKES}
    registered = {**real, **fakes}
    monkeypatch.setattr(parity_harness._backends.registry, "backend_entry_points", lambda: registered)
    monkeypatch.setattr(parity_harness._cli.main, "backend_entry_points", lambda: registered)

    def run(name: str, *options: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = parity_harness._cli.main.main(["run", *options, "--backends", name, "-q"])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def assert_disagreement(code: int, out: str, err: str, *needles: str) -> None:
    """Exit 1, a FAIL verdict as the last line, and a report line naming the broken tap and the problem."""
    assert code == 1, (code, out[-2000:], err[-2000:])
    assert out.splitlines()[-1].startswith("FAIL"), out[-2000:]
    assert "Traceback" not in out + err and "PASS" not in out
    failing = [ln for ln in out.splitlines() if " FAIL " in ln]
    assert failing and all(TAP in ln for ln in failing), failing  # only the broken tap fails
    for needle in needles:
        assert any(needle in ln for ln in failing), (needle, failing)


def test_the_fake_harness_passes_a_perfect_backend(run_fake: Callable[..., tuple[int, str, str]]) -> None:
    """The control: the same machinery with an undamaged golden copy exits 0."""
    code, out, err = run_fake("fake-perfect")
    assert code == 0, out + err
    assert out.splitlines()[-1].startswith("PASS")


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("fake-nan", (f"worst {CASE}", "NaN in the candidate at [2, 3]")),
        ("fake-shape", ("shape [32, 7] != expected [7, 32]",)),
        ("fake-dtype", ("dtype float32 != expected float64",)),
        ("fake-missing-tap", ("missing",)),
    ],
)
def test_bad_numbers_are_a_disagreement_at_the_tap(
    run_fake: Callable[..., tuple[int, str, str]], name: str, needles: tuple[str, ...]
) -> None:
    assert_disagreement(*run_fake(name, "-v"), *needles)  # -v: the per-tap rows name the tap and the problem


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("fake-list", ("'fake-list'", "returned list, expected a dict by case")),
        ("fake-missing-case", ("'fake-missing-case'", f"no result for case {CASE!r}")),
        ("fake-taps-list", ("'fake-taps-list'", "expected a dict by tap")),
        ("fake-raises", ("'fake-raises'", "crashed", "RuntimeError", "index 9 is out of bounds")),
    ],
)
def test_unusable_backend_exits_2_with_one_line(
    run_fake: Callable[..., tuple[int, str, str]], name: str, needles: tuple[str, ...]
) -> None:
    assert_one_error_line(*run_fake(name), *needles)


# -- the typescript backend's Node: missing, crashing, hanging (a subprocess, as users run it) -------


def _fake_node(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-node"
    script.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def test_missing_node_exits_2_with_one_line() -> None:
    proc = run_cli("run", "--backends", "typescript", "-q", env={"PARITY_NODE": "/nonexistent"})
    assert_one_line_error(proc, "typescript", "node", "pip install 'parity-harness[node]'")


@pytest.mark.skipif(sys.platform == "win32", reason="shell-script stand-in for Node")
def test_crashing_node_exits_2_with_its_stderr(tmp_path: Path) -> None:
    fake = _fake_node(tmp_path, 'echo "warming up" >&2\necho "TypeError: x.data is undefined" >&2\nexit 3')
    proc = run_cli("run", "--backends", "typescript", "-q", env={"PARITY_NODE": str(fake)})
    assert_one_line_error(proc, "typescript", "exit code 3", "TypeError: x.data is undefined")
    assert "PASS" not in proc.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="shell-script stand-in for Node")
def test_hanging_node_exits_2_timed_out(tmp_path: Path) -> None:
    fake = _fake_node(tmp_path, "sleep 30")
    proc = run_cli("run", "--backends", "typescript", "-q",
                   env={"PARITY_NODE": str(fake), "PARITY_NODE_TIMEOUT": "1"}, timeout=300)
    assert_one_line_error(proc, "typescript", "timed out after 1 s")
    assert "PASS" not in proc.stdout
