"""Incremental (KV-cache) decoding: the decoding check, near-ties, fixtures without decoding, generate, merge.

Decoding parity of every built-in backend on the toy is asserted by the full run
(tests/run/test_parity_full.py), and the decoding mutants by `parity selftest` (tests/tools/test_selftest.py).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._cli.exit_codes import for_verdict
from parity_harness._compare.decoding import FAIL, NEAR_TIE, greedy_checks
from parity_harness._compare.judge import CheckResult
from parity_harness._core.status import Status, Verdict
from parity_harness._fixture.decoding import golden_decoding, step_key, top2_margin
from parity_harness._fixture.fixture import MANIFEST, Fixture, load_fixture
from parity_harness._run.runner import run_parity
from parity_harness._views.console import print_report, write_json
from tests.helpers import REPO, edit_manifest, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

MASK_ANCHOR = "config.causal && j > pos ?"


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


def _report_text(fixture: Fixture, backends: list[str]) -> tuple[int, str]:
    from parity_harness._backends.registry import load_backend

    report = run_parity(fixture, [load_backend(b) for b in backends], progress=None)
    out = io.StringIO()
    print_report(report, out)
    return for_verdict(report.verdict), out.getvalue()


def test_the_toy_declares_its_decoding_goldens(toy: Fixture) -> None:
    decoding = toy.decoding()
    assert decoding is not None and decoding.steps >= 6
    assert any(len(p.tokens) == 1 for p in decoding.prompts)  # a single-token prompt
    for p in decoding.prompts:
        assert len(p.tokens) + decoding.steps <= toy.config.n_ctx
        assert len(p.generated) == decoding.steps + 1
    golden = golden_decoding(toy, "fp64")
    for p in decoding.prompts:  # the greedy tokens are the argmax of the golden logits, step by step
        assert [int(np.argmax(golden[p.name][step_key(k, "logits")])) for k in range(decoding.steps + 1)] \
            == list(p.generated)
        assert golden[p.name][step_key(decoding.steps, "blocks.0.attn.cache_k")].shape == (
            toy.config.n_head, len(p.tokens) + decoding.steps, toy.config.d_head)


def test_a_fixture_without_decoding_goldens_says_so_once(fixture_copy: Path) -> None:
    def drop(m: dict) -> None:  # type: ignore[type-arg]
        files = m["files"].pop("decoding")
        del m["decoding"]
        for name in files.values():
            del m["sha256"][name]
            (fixture_copy / name).unlink()

    edit_manifest(fixture_copy, drop)
    code, text = _report_text(load_fixture(fixture_copy), ["numpy"])
    assert code == 0
    lines = [line for line in text.splitlines() if "decoding" in line]
    assert lines == ["decoding: not checked: the fixture has no decoding goldens (no files.decoding in its manifest)"]
    assert text.splitlines()[-1].startswith("PASS: every backend agrees on every tap it was compared on")


def test_a_malformed_decoding_section_is_bad_input(fixture_copy: Path) -> None:
    edit_manifest(fixture_copy, lambda m: m["decoding"]["prompts"][0].update(tokens=[0] * 12))
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"parity: error: {fixture_copy / MANIFEST}: decoding: prompt 'the_cat': 12 tokens + 6 steps exceed the "
        "context (16)"
    ]


def test_a_wrong_decoding_golden_fails_the_run_at_its_step_and_tap(fixture_copy: Path, toy: Fixture) -> None:
    """One cached key changed in the fp64 decoding golden: numpy fp64 fails there, exit 1, the rest agrees."""
    from safetensors.numpy import save_file

    from parity_harness._fixture.fixture import read_safetensors
    from tests.helpers import rehash

    path = fixture_copy / "golden.decode.fp64.safetensors"
    tensors = read_safetensors(path)
    key = "the_cat/step2/blocks.1.attn.cache_v"
    tensors[key] = tensors[key].copy()
    tensors[key][1, 4, 2] += 1e-9  # position 4: the token fed at step 2
    for k in range(3, 7):  # the same cell in every later cache holds the same position
        later = f"the_cat/step{k}/blocks.1.attn.cache_v"
        tensors[later] = tensors[later].copy()
        tensors[later][1, 4, 2] += 1e-9
    save_file(tensors, str(path))
    rehash(fixture_copy)
    code, text = _report_text(load_fixture(fixture_copy), ["numpy"])
    assert code == 1
    assert ("numpy decoding fp64 vs fp64: first divergence at step 2, blocks.1.attn.cache_v, prompt the_cat, "
            "head 1, position 4 ('the'), dim 2 [1, 4, 2]") in text
    assert text.splitlines()[-1].startswith("FAIL: decoding disagreement in numpy fp64 vs fp64, first at ")


def test_a_differing_greedy_token_is_a_near_tie_when_the_logits_agree(toy: Fixture) -> None:
    """Swap the top two logits of one step by less than the tolerance: a near-tie, reported, not failed."""
    decoding = toy.decoding()
    assert decoding is not None
    golden = golden_decoding(toy, "fp64")
    output = {p: {k: v.copy() for k, v in steps.items()} for p, steps in golden.items()}
    prompt, step = decoding.prompts[0].name, 1
    near = {p: dict(steps) for p, steps in golden.items()}
    logits = golden[prompt][step_key(step, "logits")].copy()
    top2 = np.argsort(logits)[::-1][:2]
    logits[top2[1]] = logits[top2[0]] - 1e-7  # the golden: a near-tie, margin 1e-7
    near[prompt] = {**near[prompt], step_key(step, "logits"): logits}
    mine = logits.copy()
    mine[top2[1]] = logits[top2[0]] + 1e-7  # the backend picks the other word
    output[prompt][step_key(step, "logits")] = mine
    rows = greedy_checks(toy, "fake", "fp64", output, near, checks=[])
    bad = [r for r in rows if r.status != "ok"]
    assert [(r.prompt, r.status, r.first_step) for r in bad] == [(prompt, NEAR_TIE, step)]
    margin = bad[0].margin
    assert margin is not None and margin < 2e-7
    assert margin == pytest.approx(top2_margin(logits))
    # The same differing token where the logits are out of tolerance is a failure.
    failing = CheckResult("fake", "fp64", "fp64", prompt, "logits", Status.FAIL, False, 1e-12, 0.0, 1.0, 1.0, step=step)
    rows = greedy_checks(toy, "fake", "fp64", output, near, checks=[failing])
    assert [r.status for r in rows if r.status != "ok"] == [FAIL]


def test_merged_reports_keep_the_decoding_verdict(toy: Fixture, tmp_path: Path) -> None:
    from parity_harness._run.merge import merge_reports

    first = run_parity(toy, [NumpyBackend()], ["fp32"], progress=None)
    write_json(first, tmp_path / "a.json")
    second = run_parity(toy, [NumpyBackend()], ["fp64"], progress=None)
    assert second.decoding is not None
    greedy = second.decoding.greedy[0]  # as if that shard's greedy tokens had differed (merge checks they do)
    greedy.status, greedy.actual = FAIL, [(t + 1) % len(toy.vocab) for t in greedy.actual]
    write_json(second, tmp_path / "b.json")
    assert json.loads((tmp_path / "a.json").read_text())["decoding"]["passed"] is True
    merged = merge_reports([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged.decoding is not None
    assert {(r.backend, r.precision) for r in merged.decoding.runs} == {("numpy", "fp32"), ("numpy", "fp64")}
    assert merged.verdict == Verdict.DISAGREE


# -- parity generate ------------------------------------------------------------------------------


def test_generate_prints_every_backend_side_by_side() -> None:
    proc = run_cli("generate", "--prompt", "the cat", "--steps", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == 'parity generate: prompt ". the cat" (3 tokens), 8 greedy steps'
    table = [line for line in lines[2:] if not line.startswith(("decod", "AGREE"))]
    rows = {line.split("  ")[0].strip(): line.split()[2:] for line in table}
    from tests.helpers import BUILTIN_PRECISIONS, DECODING_BACKENDS

    expected = {f"{b} {p}" for b in DECODING_BACKENDS for p in BUILTIN_PRECISIONS[b]}
    assert set(rows) == expected
    words = next(iter(rows.values()))
    assert len(words) == 8 and all(w == words for w in rows.values())
    assert lines[-1] == (f'AGREE: {len(expected)} backend x precision runs continue ". the cat" with the same 8 '
                         "words: " + " ".join(words))


def test_generate_exits_1_when_a_port_continues_differently(tmp_path: Path) -> None:
    ts = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", ts, ignore=shutil.ignore_patterns("tests"))
    source = (ts / "model" / "model.ts").read_text()
    assert source.count(MASK_ANCHOR) == 1
    (ts / "model" / "model.ts").write_text(source.replace(MASK_ANCHOR, "config.causal && j > 0 ?"))
    proc = run_cli("generate", "--prompt", "the cat", "--backends", "numpy,typescript",
                   env={"PARITY_TS_DIR": str(ts)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("DIFFER: from word ") and "top-2 logit margin there" in last
    assert last.endswith("not a near-tie: a real disagreement")


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", "the cow"], "unknown word 'cow' in the prompt"),
    (["--prompt", "the cat", "--steps", "15"], "more than the context (16): at most 14 steps"),
    (["--prompt", "the cat", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["--prompt", "  "], "the prompt is empty"),
])
def test_generate_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    proc = run_cli("generate", "--backends", "numpy", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
