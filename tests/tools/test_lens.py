"""`parity lens`: each stream's top guess at each position, from the golden, with backends checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness._fixture.fixture import load_fixture
from parity_harness._tools.lens import format_grid, golden_grid, mark_backend
from parity_harness._views.plots import DPI, lens_figsize
from tests.helpers import assert_real_picture, perturb_weight, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def test_lens_prints_the_grid_and_draws_a_real_picture(toy_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "lens.png"
    proc = run_cli("lens", "--fixture", str(toy_dir), "--case", "grammar_2", "--backends", "numpy,typescript",
                   "--plot", str(png))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fixture = load_fixture(toy_dir)
    grid = golden_grid(fixture, "grammar_2")
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("0:"))
    assert header.split() == [f"{t}:{w}" for t, w in enumerate(grid.words)]
    for k in range(3):
        row = next(ln for ln in lines if ln.startswith(f"logit_lens.{k} "))
        cells = row.split()[1:]
        assert cells[0::2] == grid.top_words[k]  # word, probability, word, probability, ...
        assert "*" not in row
    # The last stream is the model's own prediction: its top words are the argmax of `probs`.
    probs = fixture.golden("fp64")["grammar_2"]["probs"]
    assert grid.top_words[-1] == [fixture.vocab[i] for i in probs.argmax(-1)]
    assert "AGREE" in lines[-1] and "numpy fp32" in lines[-1] and "typescript fp64" in lines[-1]
    width, height = lens_figsize(len(grid.words), 3)
    assert_real_picture(png, (int(width * DPI), int(height * DPI)))


def test_lens_marks_cells_where_a_backend_disagrees(fixture_copy: Path) -> None:
    for i in range(8):  # a large change to the final LayerNorm's bias moves every stream's logits
        perturb_weight(fixture_copy, "ln_f.bias", (i,), 2.0)
    proc = run_cli("lens", "--fixture", str(fixture_copy), "--case", "grammar_2", "--backends", "numpy")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fixture = load_fixture(fixture_copy)
    grid = golden_grid(fixture, "grammar_2")
    from parity_harness._backends.numpy_backend import NumpyBackend  # the golden was not regenerated: numpy differs

    mark_backend(grid, "numpy fp64", NumpyBackend().run(fixture, "fp64")["grammar_2"],
                 [f"logit_lens.{k}" for k in range(3)])
    assert grid.marks
    starred = [ln for ln in proc.stdout.splitlines() if ln.startswith("* logit_lens.")]
    assert len(starred) == len(grid.marks)
    assert sum(ln.count("*") for ln in proc.stdout.splitlines() if ln.startswith("logit_lens.")) == len(grid.marks)
    assert proc.stdout.splitlines()[-1].startswith(f"DIFFER: {len(grid.marks)} cell(s)")


def test_mark_backend_marks_exactly_the_changed_cells(toy_dir: Path) -> None:
    fixture = load_fixture(toy_dir)
    grid = golden_grid(fixture, "grammar_0")
    golden = fixture.golden("fp64")["grammar_0"]
    taps = [f"logit_lens.{k}" for k in range(3)]
    output = {t: golden[t].copy() for t in taps}
    output["logit_lens.1"][2] = np.eye(12)[3]  # position 2 of stream 1 now says "big"
    mark_backend(grid, "fake fp64", output, taps)
    assert grid.marks == {(1, 2): ["fake fp64: 'big'"]}
    assert "*" in format_grid(grid)[2] and "*" not in format_grid(grid)[1]


def test_unknown_case_exits_2_with_one_line(toy_dir: Path) -> None:
    proc = run_cli("lens", "--fixture", str(toy_dir), "--case", "nope", "--backends", "numpy")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("parity: error: unknown case 'nope'") and "grammar_0" in proc.stderr
    assert proc.stdout == ""
