"""`parity lens` is quick by default and takes -q; `parity generate` on one backend compares its two precisions.

- lens: without --backends it checks the reference backends (pytorch, numpy) in fp32 and fp64, 4 runs, not
  the 22 backend x precision runs of every available backend (`--all-backends`); `-q` silences progress.
- generate: `--backends numpy` runs numpy in fp32 and fp64 and compares the two continuations (exit 0 when
  they agree, 1 when they differ); a single run compares nothing (exit 2).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

from parity_harness._backends.base import Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._core.status import Verdict
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest, step_key
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.generate import run_generate
from tests.helpers import run_cli


def _checked(stdout: str) -> list[str]:
    last = stdout.splitlines()[-1]
    match = re.search(r"\(checked: (.*)\)$", last)
    assert match, last
    return match.group(1).split(", ")


def test_lens_default_is_the_reference_backends_in_fp32_and_fp64_and_takes_q() -> None:
    proc = run_cli("lens", "--case", "grammar_2", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parity: running" not in proc.stderr, proc.stderr  # -q: no progress lines
    assert _checked(proc.stdout) == ["pytorch fp32", "pytorch fp64", "numpy fp32", "numpy fp64"]


def test_lens_all_backends_and_backends_together_is_one_line() -> None:
    proc = run_cli("lens", "--case", "grammar_2", "--all-backends", "--backends", "numpy", "-q")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--all-backends" in proc.stderr, proc.stderr


def test_lens_named_backend_runs_in_every_precision_it_computes_in() -> None:
    proc = run_cli("lens", "--case", "grammar_2", "--backends", "numpy", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _checked(proc.stdout) == ["numpy fp32", "numpy fp64", "numpy fp16"]


def test_generate_one_backend_compares_its_two_precisions() -> None:
    proc = run_cli("generate", "--prompt", "the cat", "--backends", "numpy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("AGREE: 2 backend x precision runs"), lines[-1]
    assert any("compared with each other" in ln for ln in lines), proc.stdout


class Fp64Diverges(NumpyBackend):
    """numpy, but its fp64 decoding prefers another word at the third generated word."""

    name = "fp64-diverges"

    def decode(self, fixture: Fixture, precision: Precision,
               requests: list[DecodeRequest] | None = None) -> DecodeOutput:
        out = super().decode(fixture, precision, requests)
        if precision == "fp64":
            for steps in out.values():
                logits = steps[step_key(2, "logits")]
                boosted = logits.copy()
                boosted[int(np.argsort(logits)[-2])] = logits.max() + 1.0
                steps[step_key(2, "logits")] = boosted
        return out


def test_generate_one_backend_whose_precisions_differ_is_a_disagreement(toy_dir: Path) -> None:
    out = io.StringIO()
    verdict = run_generate(load_fixture(toy_dir), "the cat", 4, [Fp64Diverges()], ["fp32", "fp64"], out)
    assert verdict is Verdict.DISAGREE, out.getvalue()
    assert "DIFFER: from word 3" in out.getvalue().splitlines()[-1], out.getvalue()


def test_generate_of_one_run_compares_nothing() -> None:
    proc = run_cli("generate", "--prompt", "the cat", "--backends", "numpy", "--precision", "fp64")
    assert proc.returncode == 2
    assert "nothing compared: only one run decodes (numpy fp64)" in proc.stderr, proc.stderr
