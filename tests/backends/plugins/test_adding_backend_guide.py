"""docs/adding-a-backend.md is literally followable: its marked steps are run, in order.

Markers in the guide (HTML comments, invisible when rendered), each right before a code block:
- `<!-- guide-step: file PATH -->`: the block is written to PATH (relative to the working directory);
- `<!-- guide-step: run [expect="TEXT"] -->`: each line of the block is a command that must exit 0
  (and print TEXT, if given). `pip install ...` runs as `python -m pip install --no-deps
  --no-build-isolation --no-index ...` (tests/helpers.pip_install_command) and `parity ...` as
  `python -m parity_harness ...`, with the Python of a fresh virtual environment that sees this one's
  packages (tests/helpers.make_child_env), so no network is used and the running environment
  is never changed;
- `<!-- guide-excerpt: FILE -->`: every line of the block (but `...`) appears in FILE, verbatim;
- `<!-- guide-check: compile -->`: the block is valid Python;
- `<!-- guide-onnx-step: ... -->`: as `guide-step`, the second walk-through (an ONNX runtime), run on
  its own, on a fixture that ships its ONNX graphs.
The working directory holds `fixtures/toy`, a fixture built from random weights, as a checkout would.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import build_random_fixture, make_child_env, needs_cli, pip_install_command, run_harness

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

REPO = Path(__file__).resolve().parents[3]
GUIDE = REPO / "docs" / "adding-a-backend.md"
MARKER = re.compile(r"<!--\s*guide-(step|onnx-step|excerpt|check):\s*(.*?)\s*-->\s*\n```[\w-]*\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Block:
    kind: str  # "step", "onnx-step", "excerpt" or "check"
    spec: str  # what follows the colon in the marker
    body: str  # the code block's text


def blocks(kind: str) -> list[Block]:
    return [Block(k, spec, body) for k, spec, body in MARKER.findall(GUIDE.read_text()) if k == kind]


def test_guide_has_the_expected_steps() -> None:
    steps = [b.spec for b in blocks("step")]
    assert steps[:2] == ["file my-parity-backend/pyproject.toml", "file my-parity-backend/my_backend.py"]
    commands = [line for b in blocks("step") if b.spec.startswith("run") for line in b.body.splitlines()]
    assert commands[0].startswith("pip install -e")
    assert [c.split()[:2] for c in commands[1:]] == [
        ["parity", "backends"],
        ["parity", "check-backend"],
        ["parity", "run"],
    ]


def test_excerpts_are_verbatim() -> None:
    excerpts = blocks("excerpt")
    assert len(excerpts) >= 2
    for block in excerpts:
        source = (REPO / block.spec).read_text()
        for line in block.body.splitlines():
            if line.strip() and line.strip() != "...":
                assert line in source, f"{block.spec} has no line {line!r}"


def test_python_blocks_compile() -> None:
    marked = [b for b in blocks("check") if b.spec == "compile"]
    marked += [b for b in [*blocks("step"), *blocks("onnx-step")] if b.spec.endswith(".py")]
    assert len(marked) >= 2
    for block in marked:
        compile(block.body, f"{GUIDE.name}:{block.spec}", "exec")


def _command(python: Path, line: str) -> list[str]:
    words = shlex.split(line)
    if words[:2] == ["pip", "install"]:
        return pip_install_command(python, *words[2:])
    if words[0] == "parity":
        return words[1:]  # run_harness adds `python -m parity_harness`
    raise AssertionError(f"the guide runs {words[0]!r}; teach this test how to run it")


def _run_steps(kind: str, work: Path, python: Path) -> list[str]:
    """Every `guide-KIND` block in order: files written under `work`, commands run there; the lines run."""
    import subprocess

    ran: list[str] = []
    for block in blocks(kind):
        step, _, rest = block.spec.partition(" ")
        if step == "file":
            path = work / rest
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body + "\n")
            continue
        assert step == "run", block.spec
        expect = re.search(r'expect="([^"]*)"', rest)
        for line in block.body.splitlines():
            args = _command(python, line)
            if args[0] == str(python):
                proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=work)
            else:
                proc = run_harness(python, *args, cwd=work)
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"`{line}` exited {proc.returncode}:\n{output}"
            if expect:
                assert expect.group(1) in proc.stdout, (
                    f"`{line}` did not print {expect.group(1)!r}:\n{output}"
                )
            broken = [ln for ln in proc.stdout.splitlines() if ln.startswith("mine") and "broken" in ln]
            assert not broken, output  # `parity backends` lists a backend that fails to import as broken
            failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("check-backend") and " FAIL " in ln]
            assert not failed, output
            ran.append(line)
    return ran


def test_guide_steps_run(tmp_path: Path) -> None:
    needs_cli()
    work = tmp_path / "checkout"
    build_random_fixture(work / "fixtures" / "toy")
    python = make_child_env(tmp_path / "venv")
    ran = _run_steps("step", work, python)
    assert len(ran) == 4
    # The last step wrote a report: the backend's rows, its unsupported taps reported as such.
    data = json.loads((work / "mine.json").read_text())
    assert data["passed"] is True
    rows = [r for r in data["results"] if r["backend"] == "mine"]
    assert {r["status"] for r in rows} == {"ok", "not_supported"}
    assert all(r["status"] == "not_supported" for r in rows if ".attn." in r["tap"])
    assert {r["golden"] for r in rows} == {"fp32", "fp64"}
    shutil.rmtree(work / "my-parity-backend")  # editable install: the child venv dies with tmp_path anyway


def test_onnx_walkthrough_runs_in_under_60_lines(tmp_path: Path) -> None:
    """The second walk-through: an ONNX runtime backend, under 60 lines, passes check-backend and the run."""
    needs_cli()
    source = next(b.body for b in blocks("onnx-step") if b.spec.endswith(".py"))
    assert len(source.splitlines()) < 60
    assert "runs_graph = True" in source
    work = tmp_path / "checkout"
    build_random_fixture(work / "fixtures" / "toy", onnx=True)
    python = make_child_env(tmp_path / "venv")
    ran = _run_steps("onnx-step", work, python)
    assert [line.split()[:2] for line in ran] == [["pip", "install"], ["parity", "check-backend"], ["parity", "run"]]
    data = json.loads((work / "mine-onnx.json").read_text())
    assert data["passed"] is True
    rows = [r for r in data["results"] if r["backend"] == "mine-onnx"]
    assert rows and {r["status"] for r in rows} == {"ok"}  # every tap, in fp32
    assert {r["golden"] for r in rows} == {"fp32"}
    shutil.rmtree(work / "my-onnx-backend")
