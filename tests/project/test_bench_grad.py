"""The backward benchmark (`python -m benchmarks.bench --preset gpt2-small --grad`) reads what `parity run --grad`
prints and judges issue 39's target (3x the forward run, 6 GB) from the numbers it measured."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.bench import GRAD_ACCEPTANCE, _grad_lines
from tests.helpers import REPO, TOY


def test_the_grad_lines_are_the_backends_backward_and_training_rows() -> None:
    proc = subprocess.run([sys.executable, "-m", "parity_harness", "run", "--grad", "--backends", "numpy",
                           "--precision", "fp64", "--fixture", str(TOY)], capture_output=True, text=True,
                          check=False, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _grad_lines(proc.stdout, "numpy")
    assert [ln.split()[1] for ln in lines] == ["backward", "backward", "training", "training"], proc.stdout
    assert all(ln.split()[2] == "fp64" for ln in lines)
    assert _grad_lines(proc.stdout, "pytorch") == []


def test_the_target_is_issue_39s() -> None:
    target = GRAD_ACCEPTANCE["gpt2-small"]
    assert set(target.backends) == {"pytorch", "numpy", "hf-transformers"}
    assert target.verdict(29.0, 10.0, 5999.0).startswith("within")
    assert target.verdict(31.0, 10.0, 5000.0).startswith("MISSES")  # 3.1x
    assert target.verdict(10.0, 10.0, 6001.0).startswith("MISSES")  # over 6 GB


def test_the_verdict_names_which_target_it_misses() -> None:
    from benchmarks.bench import GRAD_ACCEPTANCE

    target = GRAD_ACCEPTANCE["gpt2-small"]
    assert target.verdict(40.0, 10.0, 5000.0) == "MISSES issue 39's 3x (4.00x, 5.00 GB; 6 GB met)"
    assert target.verdict(10.0, 10.0, 7000.0) == "MISSES issue 39's 6 GB (1.00x, 7.00 GB; 3x met)"
    assert target.verdict(40.0, 10.0, 7000.0) == "MISSES issue 39's 3x and 6 GB (4.00x, 7.00 GB)"
