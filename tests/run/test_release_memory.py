"""After each backend of a large fixture (parity_harness/_run/runner.py): memory handed back, and what outlives
the backend frozen out of the garbage collector's scans, one lane only, all of it unfrozen when the run ends.

What must hold:
- `release_memory(freeze=True)` inside `survivors_frozen` freezes what survived, and leaving it unfreezes;
- objects the caller froze before are never unfrozen by parity, and parity then freezes nothing;
- a run of a large fixture (1 M parameters or more) releases after each backend and freezes only with one lane
  (with two, a backend still running beside would be frozen with its garbage);
- the command (`entry`) exits with main's code after one collection and a freeze, so that Python's shutdown
  does not scan the heap again; `main`, which callers run in-process, freezes nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._fixture.fixture import Fixture
from parity_harness._run import runner


@pytest.fixture(autouse=True)
def _nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_survivors_are_frozen_until_the_run_ends() -> None:
    with runner.survivors_frozen(True) as on:
        assert on
        keep = [object() for _ in range(10)]
        runner.release_memory(freeze=True)
        assert gc.get_freeze_count() >= len(keep)
    assert gc.get_freeze_count() == 0


def test_the_callers_frozen_objects_stay_frozen_and_parity_freezes_nothing() -> None:
    gc.freeze()
    before = gc.get_freeze_count()
    assert before > 0
    with runner.survivors_frozen(True) as on:
        assert not on
    assert gc.get_freeze_count() == before
    with runner.survivors_frozen(False) as on:
        assert not on


class _Golden(Backend):
    """A perfect float64 backend (the golden, copied), concurrent so that two lanes run it beside another."""

    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return {case: {tap: a.copy() for tap, a in taps.items()} for case, taps in fixture.golden(precision).items()}


def _backends() -> list[Backend]:
    return [type(f"B_{k}", (_Golden,), {"name": f"g-release-{k}", "concurrent": True})() for k in "abc"]


@pytest.mark.parametrize(("jobs", "frozen"), [(1, True), (2, False)])
def test_a_large_fixture_releases_after_each_backend_and_freezes_with_one_lane_only(
        monkeypatch: pytest.MonkeyPatch, jobs: int, frozen: bool) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(Fixture, "parameter_count", lambda self: runner.RELEASE_PARAMETERS)
    monkeypatch.setattr(runner, "release_memory", lambda freeze=False: calls.append(freeze))
    assert api.run(_backends(), precisions="fp64", jobs=jobs).passed
    assert calls == [frozen] * 3


def test_a_small_fixture_releases_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(runner, "release_memory", lambda freeze=False: calls.append(freeze))
    assert api.run(_backends(), precisions="fp64").passed
    assert calls == []


def test_the_command_exits_with_mains_code_after_freezing_what_survives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`entry` (the `parity` script, `python -m parity_harness`): main's exit code, unchanged, and the heap
    frozen so that Python's shutdown collections skip it; `main` itself (called in-process) freezes nothing."""
    from parity_harness._cli import main as cli

    for code in (0, 1, 2):
        gc.unfreeze()
        monkeypatch.setattr(cli, "main", lambda code=code: code)
        with pytest.raises(SystemExit) as exited:
            cli.entry()
        assert exited.value.code == code
        assert gc.get_freeze_count() > 0
    gc.unfreeze()
    monkeypatch.undo()
    assert cli.main(["run", "--fixture", str(tmp_path / "none")]) == 2  # a missing fixture: bad input
    assert gc.get_freeze_count() == 0


def test_the_installed_script_and_python_m_both_go_through_entry() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["parity"] == "parity_harness._cli.main:entry"
    assert "entry()" in (root / "harness" / "parity_harness" / "__main__.py").read_text()
