"""The stale-goldens hint (issue 37, item 10): only the backend that made the goldens disagrees."""

from __future__ import annotations

import json
from pathlib import Path

from parity_harness._compare.diagnose import golden_maker, stale_golden_hint
from parity_harness._compare.judge import CheckResult
from parity_harness._compare.report import Report
from parity_harness._core.status import Status


def check(backend: str, passed: bool) -> CheckResult:
    return CheckResult(backend, "fp32", "fp32", "grammar_0", "hook_embed", Status.OK if passed else Status.FAIL,
                       passed, 1e-5, 1e-5)


def report(fixture: Path, *outcomes: tuple[str, bool]) -> Report:
    return Report(str(fixture), results=[check(b, p) for b, p in outcomes])


def test_the_toys_goldens_were_made_by_the_pytorch_reference(toy_dir: Path) -> None:
    provenance = json.loads((toy_dir / "manifest.json").read_text())["provenance"]
    assert golden_maker(provenance) == "pytorch"
    assert golden_maker({"command": "parity export --preset gpt2-mini --seed 0"}) == "pytorch"
    assert golden_maker({"golden_backend": "numpy"}) == "numpy"
    assert golden_maker({"command": "made by hand"}) is None


def test_only_the_maker_failing_hints_stale_goldens(toy_dir: Path) -> None:
    hint = stale_golden_hint(report(toy_dir, ("pytorch", False), ("numpy", True), ("onnxruntime", True)))
    assert hint is not None
    assert hint.startswith("only pytorch, the backend that made the goldens, disagrees; numpy, onnxruntime agree")
    assert "goldens may be stale" in hint and "`parity export --check`" in hint and "`parity export`" in hint


def test_no_hint_when_the_pattern_does_not_fit(toy_dir: Path) -> None:
    assert stale_golden_hint(report(toy_dir, ("pytorch", True), ("numpy", True))) is None  # all agree
    assert stale_golden_hint(report(toy_dir, ("pytorch", False), ("numpy", False))) is None  # others fail too
    assert stale_golden_hint(report(toy_dir, ("pytorch", True), ("numpy", False))) is None  # another one fails
    assert stale_golden_hint(report(toy_dir, ("pytorch", False))) is None  # nobody else to agree with
    assert stale_golden_hint(report(toy_dir, ("pytorch", False), ("numpy", True)), {"command": "by hand"}) is None
    assert stale_golden_hint(report(Path("/nonexistent"), ("pytorch", False), ("numpy", True))) is None


def test_the_regenerating_command_is_the_fixtures_own(toy_dir: Path) -> None:
    provenance = {"command": "parity export --preset gpt2-mini --seed 0"}
    hint = stale_golden_hint(report(toy_dir, ("pytorch", False), ("numpy", True)), provenance)
    assert hint is not None and hint.endswith("`parity export --preset gpt2-mini --seed 0` regenerates them")
