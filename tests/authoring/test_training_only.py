"""`parity export --training-only`: an option that would choose another fixture or another job is refused in one
line (exit 2), never ignored, and nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import assert_exit_2_one_line, run_cli


@pytest.mark.parametrize("extra", [["--check"], ["--decoding-only"], ["--preset", "gpt2-mini"],
                                   ["--from-hf", "somewhere"]], ids=["check", "decoding-only", "preset", "from-hf"])
def test_training_only_refuses_what_it_would_ignore(tmp_path: Path, toy_dir: Path, extra: list[str]) -> None:
    root = tmp_path / "toy"
    shutil.copytree(toy_dir, root)
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    proc = run_cli("export", "--training-only", "--fixture", str(root), *extra)
    assert_exit_2_one_line(proc, "--training-only", "does not combine with", extra[0])
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before
