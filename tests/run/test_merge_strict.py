"""`parity merge` reads a report's identity strictly: `schema_version` must be the integer 1 (not `true`, which
Python counts as 1, nor 1.0), and only a report of `parity run` or `parity compare` is merged (a `command` of
`selftest`, or of anything else, is refused). Each refusal is one line naming the file, exit 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parity_harness._cli.main import main
from tests.helpers import TOY


@pytest.fixture(scope="module")
def numpy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("merge-strict") / "numpy.json"
    assert main(["run", "-q", "--backends", "numpy", "--precision", "fp32", "--fixture", str(TOY),
                 "--json", str(path)]) == 0
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def merge(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> tuple[int, str, Path]:
    path = tmp_path / "shard.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    code = main(["merge", str(path)])
    return code, capsys.readouterr().err, path


def test_the_report_as_written_merges(numpy_report: dict[str, Any], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, err, _ = merge(tmp_path, capsys, numpy_report)
    assert code == 0, err


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d.update(schema_version=True), "schema version True"),
    (lambda d: d.update(schema_version=1.0), "schema version 1.0"),
    (lambda d: d.update(command="selftest"), "a report of `parity selftest`"),
    (lambda d: d.update(command="merge"), "a report of `parity merge`"),
    (lambda d: d.update(command=["run"]), "a report of `parity ['run']`"),
], ids=["version-true", "version-float", "command-selftest", "command-merge", "command-list"])
def test_a_report_that_is_not_strictly_a_run_is_refused_naming_the_file(
        numpy_report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        change: Callable[[dict[str, Any]], None], needle: str) -> None:
    doc = json.loads(json.dumps(numpy_report))
    change(doc)
    code, err, path = merge(tmp_path, capsys, doc)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and needle in lines[0], lines


def test_a_compare_report_still_merges(numpy_report: dict[str, Any], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, err, _ = merge(tmp_path, capsys, {**numpy_report, "command": "compare"})
    assert code == 0, err
