"""Exit 0 only when numbers were compared and agree, on every command's path (docs/security.md, exit codes).

Each case is one way an audit reached exit 0 (or exit 1 for bad input) outside `parity run`'s main path:
plugin code run outside a backend call raising `SystemExit(0)`; `verify-ts` on a fixture every other command
refuses; `merge` of a report whose tolerances were removed or loosened; `diff` of two backends that both break
the tolerance; `generate` of one backend against itself; `run` naming a backend that computes in none of the
precisions asked; `PARITY_DEBUG=1` turning an internal error into exit 1. All run the real CLI in-process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._core.precision import Precision
from parity_harness._fixture.fixture import Fixture
from tests.helpers import TOY, cli_with_backends

Parity = Callable[..., tuple[int, str, str]]


class ExitOnCompare(str):
    """A case name whose comparison ends the process "successfully": plugin code the boundary's checks run."""

    __hash__ = str.__hash__

    def __ne__(self, other: object) -> bool:
        raise SystemExit(0)

    def __eq__(self, other: object) -> bool:
        raise SystemExit(0)


class ExitingKeys(NumpyBackend):
    name: ClassVar[str] = "fake-exiting-keys"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            yield ExitOnCompare(case), taps


class OffByOne(NumpyBackend):
    """Every tap 1.0 too large: far outside any tolerance."""

    name: ClassVar[str] = "fake-off-by-one"
    precisions = ("fp32", "fp64")  # type: ignore[assignment]

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            yield case, {tap: value + 1.0 for tap, value in taps.items()}


class OffByOneToo(OffByOne):
    name: ClassVar[str] = "fake-off-by-one-too"


@pytest.fixture
def parity(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Parity:
    return cli_with_backends(monkeypatch, capsys, __name__, [ExitingKeys, OffByOne, OffByOneToo])


def one_error(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, (code, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("parity: error: "), err[-2000:]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("args", [
    ["run", "-q", "--backends", ExitingKeys.name, "--precision", "fp64"],
    ["check-backend", ExitingKeys.name],
], ids=["run", "check-backend"])
def test_a_system_exit_0_from_plugin_code_outside_a_backend_call_is_exit_2(parity: Parity, args: list[str]) -> None:
    code, out, err = parity(*args)
    one_error(code, err, "internal error: SystemExit")
    assert "PASS" not in out


def test_parity_debug_shows_the_traceback_and_still_exits_2(parity: Parity, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_DEBUG", "1")
    code, _, err = parity("run", "-q", "--backends", ExitingKeys.name, "--precision", "fp64")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("parity: error: internal")


def test_verify_ts_refuses_a_fixture_every_other_command_refuses(parity: Parity, tmp_path: Path) -> None:
    """The manifest's tolerance loosened and not re-sealed: Node's check alone would read it as it is."""
    fixture = tmp_path / "toy"
    shutil.copytree(TOY, fixture)
    manifest = json.loads((fixture / "manifest.json").read_text())
    manifest["tolerances"]["fp64"]["atol"] = 1e-10  # within its ceiling: the seal is what refuses it
    (fixture / "manifest.json").write_text(json.dumps(manifest, indent=1))
    code, _, err = parity("verify-ts", "--fixture", str(fixture))
    one_error(code, err, "manifest_sha256 mismatch")


@pytest.fixture
def report(parity: Parity, tmp_path: Path) -> Path:
    path = tmp_path / "r.json"
    code, _, err = parity("run", "-q", "--backends", "numpy", "--precision", "fp32", "--json", str(path))
    assert code == 0, err
    return path


def _edit(path: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    doc = json.loads(path.read_text())
    change(doc)
    out = path.with_name("edited.json")
    out.write_text(json.dumps(doc, indent=1))
    return out


def test_merge_refuses_a_report_without_its_tolerances(parity: Parity, report: Path) -> None:
    code, _, err = parity("merge", str(_edit(report, lambda d: d.pop("tolerances"))))
    one_error(code, err, "malformed report: 'tolerances'")


def test_merge_refuses_a_report_judged_beyond_the_ceilings_that_does_not_say_loose(parity: Parity,
                                                                                  report: Path) -> None:
    """Rows and tolerances loosened together, consistently: the numbers are real, only the threshold moved."""
    def loosen(doc: dict[str, Any]) -> None:
        doc["tolerances"]["fp32"]["atol"] = 2.0
        for row in doc["results"]:
            if row["golden"] == "fp32":
                row["atol"] = 2.0

    code, _, err = parity("merge", str(_edit(report, loosen)))
    one_error(code, err, "beyond their ceilings", "tolerances.fp32.atol 2")


@pytest.mark.parametrize("tier", ["x", [1], {"atol": 1e-5}], ids=["string", "list", "no-rtol"])
def test_merge_refuses_malformed_tolerances_naming_the_field(parity: Parity, report: Path, tier: object) -> None:
    code, _, err = parity("merge", str(_edit(report, lambda d: d["tolerances"].__setitem__("fp32", tier))))
    one_error(code, err, "'tolerances.fp32'")


def test_diff_of_two_backends_both_out_of_tolerance_is_a_disagreement(parity: Parity) -> None:
    code, out, _ = parity("diff", OffByOne.name, OffByOneToo.name, "-q")
    assert code == 1, out[-2000:]
    assert "break the fixture's tolerance" in out.splitlines()[-1]


def test_generate_of_one_run_compares_nothing(parity: Parity) -> None:
    code, _, err = parity("generate", "--prompt", "the cat", "--backends", "numpy", "--precision", "fp32")
    one_error(code, err, "nothing compared", "only one run decodes (numpy fp32)")


def test_run_naming_a_backend_that_computes_in_no_precision_asked_is_refused(parity: Parity) -> None:
    code, out, err = parity("run", "-q", "--backends", "numpy,typescript", "--precision", "fp32")
    one_error(code, err, "typescript computes in fp64 only")
    assert "PASS" not in out
