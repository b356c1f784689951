"""`parity selftest`: the harness catches the catalog's porting bugs, at the expected tap and tier.

The acceptance run is `python -m parity_harness selftest` in a subprocess: exit 0 and the totals line
(every mutant caught, >= 90% localized at the expected tap, >= 3 caught by the fp64 tier alone).
The stability mutants (softmax without the max, a one-pass variance, an additive mask, an erf
series) must be invisible on fixtures/toy in every tier and caught on fixtures/toy-stress at their tap.
The reduced-precision mutants (a softmax and a LayerNorm variance summed in fp16, a bf16 GELU in an
fp16 run) must be caught in fp16 on the fp16-probe fixture at their tap, named by what caught them
(the tolerance, "overflow", "precision"), and invisible there in fp32 and fp64; the fp16 KV cache of
an fp32 model is caught by the decoding check at step 0, on fp16's grid.
The unit tests keep the catalog honest: every anchor matches the current sources exactly once,
a missing or repeated anchor is a clear error (exit 2 through the CLI), and a failing control run
or an uncaught mutant makes the selftest fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import parity_harness._cli.main
import parity_harness._tools.mutants
from parity_harness._core.errors import ParityError
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.gpt2_mutants import FP16_STRESS, REDUCED, STABILITY
from parity_harness._tools.mutants import (
    CATALOG,
    TARGET_DIRS,
    Mutant,
    MutantAnchorError,
    Target,
    by_name,
    comment_spans,
)
from parity_harness._tools.selftest import format_table, run_selftest
from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

TOTALS = re.compile(r"^mutants caught (\d+)/(\d+), localized (\d+)/(\d+) \((\d+)%\), fp64-only (\d+)$")


@pytest.fixture(scope="module")
def fixture(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    from parity_harness._authoring.presets import make_probe_fixture

    root = tmp_path_factory.mktemp("probe") / "fp16-probe"
    make_probe_fixture(root)
    return load_fixture(root)


# -- the acceptance run ---------------------------------------------------------------------------


def test_selftest_catches_every_mutant(tmp_path: Path) -> None:
    out = tmp_path / "selftest.json"
    proc = run_cli("selftest", "-q", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    last = proc.stdout.splitlines()[-1]
    match = TOTALS.match(last)
    assert match, last
    caught, n, localized, n2, pct, fp64_only = map(int, match.groups())
    assert n == n2 == len(CATALOG) >= 15
    assert caught == n
    assert localized >= 0.9 * n and pct == round(100 * localized / n)
    assert fp64_only >= 3
    assert "control (typescript, unpatched): pass" in proc.stdout
    assert "control (reference, unpatched): pass" in proc.stdout

    report = json.loads(out.read_text())
    assert report["exit_code"] == 0 and report["failures"] == []
    assert all(why == "" for why in report["controls"].values())
    for row in report["mutants"]:
        # The catalog's claims hold on the committed fixture: the tap and the tier.
        assert row["caught"] and not row["error"], row
        assert row["fp64_only"] == row["expected_fp64_only"], row
        if row["fp64_only"]:
            assert row["tiers"] == ["fp64/fp64"], row
    # The decoding mutants: caught by the decoding check alone, at their step and tap.
    decoding_rows = [r for r in report["mutants"] if r["expected_step"] is not None]
    assert {r["name"] for r in decoding_rows} >= {"ts-decode-position-not-offset", "ts-decode-cache-appended-after-use",
                                                  "ts-decode-mask-single-query", "ts-decode-cache-transposed"}
    for row in decoding_rows:
        assert row["localized"] and row["first_step"] == row["expected_step"], row
    localized_rows = [r for r in report["mutants"] if r["localized"]]
    assert len(localized_rows) == localized
    # The stability mutants: invisible on the toy (every tier), caught on the stress fixture at their tap.
    stability = [r for r in report["mutants"] if r["caught_on"] == "stress"]
    assert {r["name"] for r in stability} == {m.name for m in STABILITY} and len(stability) >= 4
    for row in stability:
        assert row["invisible_on_toy"] is True and row["toy_tiers"] == [] and not row["toy_error"], row
        assert row["caught"] and row["localized"], row
    assert all(why == "" for why in report["stress_controls"].values()) and report["stress_controls"]
    assert report["totals"]["invisible_on_toy_caught_on_stress"] == len(STABILITY)
    assert f"stability mutants invisible on toy, caught on stress: {len(STABILITY)}/{len(STABILITY)}" in proc.stdout
    assert "control (typescript, unpatched, toy-stress): pass" in proc.stdout
    # The reduced-precision mutants: caught in fp16 on the probe at their tap, invisible there in fp32 and fp64.
    reduced = {r["name"]: r for r in report["mutants"] if r["caught_on"] == "probe"}
    assert set(reduced) == {m.name for m in REDUCED if m.caught_on == "probe"} and len(reduced) == 3
    for row in reduced.values():
        assert row["caught"] and row["localized"] and row["invisible_in_fp32"] is True, row
        assert row["tiers"] == ["fp16/fp32", "fp16/fp64"] and row["fp32_tiers"] == [], row
    assert reduced["py-rp-softmax-fp16-sum"]["cause"] == "tolerance"
    assert reduced["py-rp-ln-var-fp16-sum"]["cause"] == "overflow"
    assert reduced["py-rp-gelu-bf16"]["cause"] == "precision"
    assert "computed in bf16" in reduced["py-rp-gelu-bf16"]["first_message"]
    kv = next(r for r in report["mutants"] if r["name"] == "py-rp-kv-cache-fp16")
    assert kv["localized"] and kv["first_step"] == 0 and "fp16's grid" in kv["first_message"], kv
    assert all(why == "" for why in report["probe_controls"].values()) and report["probe_controls"]
    assert report["totals"]["reduced_caught_at_tap_invisible_in_fp32"] == 3
    assert "reduced-precision mutants caught in fp16 at their tap, invisible in fp32 and fp64: 3/3" in proc.stdout
    assert "control (reference, unpatched, fp16-probe, fp16/bf16/fp32/fp64): pass" in proc.stdout
    # The Llama mutants, of llama_model.py and of llama_numpy.py: caught on toy-llama at their tap, with a cause.
    llama = [r for r in report["mutants"] if r["caught_on"] == "family"]
    assert {r["family"] for r in llama} == {"llama"}
    assert {(r["target"], r["file"]) for r in llama} == {("reference", "llama_model.py"), ("numpy", "llama_numpy.py")}
    for row in llama:
        assert row["caught"] and row["localized"] and row["likely_cause"], row
    assert list(report["families"]) == ["llama"]
    family = report["families"]["llama"]
    assert family["controls"] == {"reference": "", "numpy": ""}
    assert family["fixture"] == str(REPO / "fixtures" / "toy-llama")
    assert family["mutants"] == family["caught_at_tap_with_cause"] == len(llama) == 12
    assert "control (numpy, unpatched llama_numpy.py, toy-llama): pass" in proc.stdout


def test_only_runs_the_named_mutants() -> None:
    proc = run_cli("selftest", "-q", "--only", "ts-erf-polynomial,ts-positions-float32,py-erf-polynomial")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "mutants caught 3/3, localized 3/3 (100%), fp64-only 3"


def test_stability_mutants_need_the_stress_fixture(fixture: Fixture, tmp_path: Path) -> None:
    with pytest.raises(ParityError, match="need the stress fixture"):
        run_selftest(fixture, [STABILITY[0]])
    proc = run_cli("selftest", "-q", "--only", STABILITY[0].name, "--stress-fixture", str(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "fixture directory not found" in proc.stderr


def test_a_stability_mutant_the_toy_sees_fails_the_selftest(fixture: Fixture) -> None:
    """A bug the toy already catches is not a stability bug: the pair must be (invisible, caught)."""
    relu = by_name(["py-gelu-relu"])[0]
    visible = Mutant("py-relu-as-stability", relu.target, relu.file, relu.patches, relu.description,
                     relu.expected_tap, relu.fp64_only, caught_on="stress")
    result = run_selftest(fixture, [visible], stress=load_fixture(REPO / "fixtures" / "toy-stress"))
    assert result.n_caught == 1 and result.n_pairs == 0 and result.verdict == Verdict.DISAGREE
    assert any("not invisible on the toy fixture" in why and "py-relu-as-stability" in why
               for why in result.failures())


def test_reduced_mutants_are_caught_in_fp16_at_their_tap(fixture: Fixture, probe: Fixture) -> None:
    result = run_selftest(fixture, [m for m in REDUCED if m.caught_on == "probe"], probe=probe)
    assert result.probe_controls == {"reference": ""} and result.n_reduced_ok == 3, format_table(result)
    assert [(o.first_tap, o.cause) for o in result.outcomes] == [
        ("probs", "tolerance"), ("blocks.0.ln1.hook_scale", "overflow"), ("blocks.0.mlp.hook_post", "precision")]


def test_the_probe_fixture_is_seeded_with_its_outliers(probe: Fixture, tmp_path: Path) -> None:
    """Made on demand, so it must be the same fixture every time: the same hashes, +-200 on wpe's dims 0 and 1."""
    from parity_harness._authoring.presets import PROBE_OUTLIER, make_probe_fixture

    again = tmp_path / "again"
    make_probe_fixture(again)
    assert load_fixture(again).manifest["sha256"] == probe.manifest["sha256"]
    wpe = probe.weights()["wpe.weight"]  # (n_ctx, d)
    assert probe.config.vocab_size == 4096 and probe.config.positions == "learned"
    assert abs(wpe[:, 0].mean() - PROBE_OUTLIER) < 0.1 and abs(wpe[:, 1].mean() + PROBE_OUTLIER) < 0.1
    assert abs(wpe[:, 2:]).max() < 0.2


def test_the_bf16_gelu_is_seen_by_the_grid_check_alone(fixture: Fixture, probe: Fixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the judge's coarser-grid check, the bf16 GELU passes c = 32: the check is what catches it."""
    import parity_harness._compare.judge as judge

    monkeypatch.setattr(judge, "COARSER_GRIDS", {})
    result = run_selftest(fixture, by_name(["py-rp-gelu-bf16"]), probe=probe)
    assert result.n_caught == 0 and result.verdict == Verdict.DISAGREE


def test_a_reduced_mutant_visible_in_fp32_or_astray_fails_the_selftest(fixture: Fixture, probe: Fixture) -> None:
    relu = by_name(["py-gelu-relu"])[0]  # not a half fast path: fp32 sees it too
    visible = Mutant("py-relu-as-reduced", relu.target, relu.file, relu.patches, relu.description,
                     relu.expected_tap, False, caught_on="probe", precision="fp16")
    gelu = by_name(["py-rp-gelu-bf16"])[0]
    astray = Mutant("py-gelu-bf16-astray", gelu.target, gelu.file, gelu.patches, gelu.description, "probs", False,
                    caught_on="probe", precision="fp16")
    result = run_selftest(fixture, [visible, astray], probe=probe)
    assert result.n_caught == 2 and result.n_reduced_ok == 0 and result.verdict == Verdict.DISAGREE
    why = result.failures()
    assert any("not invisible in fp32 and fp64" in w and "py-relu-as-reduced" in w for w in why), why
    assert any("not caught at their expected tap" in w and "py-gelu-bf16-astray" in w for w in why), why


def test_unknown_mutant_exits_2_with_one_line() -> None:
    proc = run_cli("selftest", "--only", "ts-no-such-bug")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.splitlines()[0]]
    assert "unknown mutant 'ts-no-such-bug'" in proc.stderr


# -- the catalog ----------------------------------------------------------------------------------


def test_catalog_shape(fixture: Fixture) -> None:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names)) >= 15
    assert sum(m.fp64_only for m in CATALOG) >= 3
    decoding = fixture.decoding()
    assert decoding is not None
    for m in CATALOG:
        if m.caught_on == "family":  # the Llama family's mutants: tests/families/llama/test_llama_mutants.py
            assert m.family == "llama" and m.name.startswith("llama-np-" if m.target == "numpy" else "llama-"), m.name
            assert m.file == {"reference": "llama_model.py", "numpy": "llama_numpy.py"}[m.target], m.name
            continue
        taps = fixture.tap_names if m.expected_step is None else decoding.taps
        assert m.expected_tap in taps, m.name
        assert m.family == "gpt2" and m.name.startswith({"typescript": "ts-", "reference": "py-"}[m.target]), m.name
        assert m.description and m.patches
        expected_on = ("stress" if m in STABILITY else "probe" if m in REDUCED and m.expected_step is None
                       else "fp16-stress" if m in FP16_STRESS else "toy")
        assert m.caught_on == expected_on, m.name
        assert (m.precision is not None) == (m.caught_on in ("probe", "fp16-stress")), m.name
    # One stability mutant per bug class, in the TypeScript port at least.
    assert {m.name for m in STABILITY if m.target == "typescript"} >= {
        "ts-softmax-no-max", "ts-ln-one-pass-variance", "ts-additive-mask", "ts-erf-series"}


def test_the_catalog_is_every_familys_mutants_the_toys_first() -> None:
    """Each family's table names its mutants module; the catalog is theirs, GPT-2's first, then table order."""
    from parity_harness._tools.mutants import catalog_families, family_mutants
    from parity_reference.families import family_names

    assert catalog_families()[0] == "gpt2" and sorted(catalog_families()) == family_names()
    assert tuple(m for f in catalog_families() for m in family_mutants(f).mutants) == CATALOG
    for f in catalog_families():
        assert all(m.family == f for m in family_mutants(f).mutants), f
    assert family_mutants("llama").fixture == "toy-llama" and family_mutants("llama").title == "Llama"


@pytest.mark.parametrize("mutant", CATALOG, ids=[m.name for m in CATALOG])
def test_every_anchor_matches_the_current_source_once(mutant: Mutant) -> None:
    source = (TARGET_DIRS[mutant.target] / mutant.file).read_text(encoding="utf-8")
    patched = mutant.apply(source)
    assert patched != source


def test_missing_anchor_is_a_clear_error() -> None:
    bad = Mutant("ts-rotten", "typescript", "model/model.ts", (("const rootDh = Math.sqrt(d_head);", "x"),),
                 "an anchor the model no longer contains", "blocks.0.attn.hook_attn_scores", False)
    source = (TARGET_DIRS["typescript"] / "model" / "model.ts").read_text(encoding="utf-8")
    with pytest.raises(MutantAnchorError) as info:
        bad.apply(source)
    message = str(info.value)
    assert "'ts-rotten'" in message and "not found" in message and "typescript/model/model.ts" in message
    assert "Math.sqrt(d_head)" in message and "\n" not in message


def test_repeated_anchor_is_a_clear_error() -> None:
    bad = Mutant("py-ambiguous", "reference", "model.py", (("torch.softmax(", "torch.log_softmax("),),
                 "an anchor that matches several places", "blocks.0.attn.hook_pattern", False)
    source = (TARGET_DIRS["reference"] / "model.py").read_text(encoding="utf-8")
    with pytest.raises(MutantAnchorError, match=r"'py-ambiguous'.*found \d+ times"):
        bad.apply(source)


@pytest.mark.parametrize(("target", "anchor"), [
    ("typescript", "/** The exact GELU, x * Phi(x)"),  # inside a doc comment
    ("typescript", "const angle = pos * invFreq[i]; // (T, d/2)"),  # code, then its shape comment
    ("reference", "biased variance (divide by d, not d - 1)"),  # inside a docstring
    ("reference", "scale = torch.sqrt(var + eps)  # (T, 1)"),  # code, then its shape comment
], ids=["ts-doc-comment", "ts-trailing-comment", "py-docstring", "py-trailing-comment"])
def test_an_anchor_that_touches_a_comment_is_a_clear_error(target: Target, anchor: str) -> None:
    """A comment can change while the code stays: an anchor there would patch nothing, or rot."""
    file = {"typescript": "model/model.ts", "reference": "model.py"}[target]
    source = (TARGET_DIRS[target] / file).read_text(encoding="utf-8")
    assert source.count(anchor) == 1  # found exactly once: only the comment rule refuses it
    bad = Mutant("x-comment", target, file, ((anchor, "x"),), "", "hook_embed", False)
    with pytest.raises(MutantAnchorError) as info:
        bad.apply(source)
    message = str(info.value)
    assert "'x-comment'" in message and "touches a comment" in message and f"{target}/{file}" in message
    assert "\n" not in message


def test_typescript_comment_spans_skip_strings_templates_and_regular_expressions() -> None:
    source = (
        'const url = "http://x"; // one\n'
        "const t = `a // ${'/*'} b`; /* two */\n"
        "const r = /\\/\\/[/]/g.test(s) ? a / b / c : 0; // three\n"
        "const s = `${ { k: 1 }.k }`; /** four\n * more */ done();\n"
    )
    comments = [source[a:b] for a, b in comment_spans(source, "typescript")]
    assert comments == ["// one", "/* two */", "// three", "/** four\n * more */"]


def test_python_comment_spans_are_comments_and_docstrings() -> None:
    source = 'def f():\n    """Doc # not a comment."""\n    return "#"  # real\n'  # "#" in a string is code
    comments = [source[a:b] for a, b in comment_spans(source, "reference")]
    assert comments == ["# real", '"""Doc # not a comment."""']


def test_a_later_patch_sees_the_earlier_ones() -> None:
    """Patches apply in order, and each anchor is checked against the text patched so far."""
    twice = Mutant("ts-twice", "typescript", "model/model.ts",
                   (("const rootDh = Math.sqrt(dh);", "const rootDh = Math.sqrt(d);"),
                    ("const rootDh = Math.sqrt(dh);", "x")), "", "blocks.0.attn.hook_attn_scores", False)
    with pytest.raises(MutantAnchorError, match="not found"):
        twice.apply((TARGET_DIRS["typescript"] / "model" / "model.ts").read_text(encoding="utf-8"))


def test_rotten_catalog_exits_2_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rotten = Mutant("py-rotten", "reference", "model.py", (("def gelu_exact(", "def gelu("),),
                    "an anchor the reference no longer contains", "blocks.0.mlp.hook_post", False)
    monkeypatch.setattr(parity_harness._tools.mutants, "CATALOG", (*CATALOG, rotten))
    code = parity_harness._cli.main.main(["selftest", "-q", "--only", "py-rotten"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("parity: error: mutant 'py-rotten': anchor")


# -- the selftest's own failure modes -------------------------------------------------------------


def test_an_invisible_mutant_fails_the_selftest(fixture: Fixture) -> None:
    noop = Mutant("py-noop", "reference", "model.py",
                  (("def gelu(x: Tensor) -> Tensor:", "def gelu(x: Tensor) -> Tensor:  # unchanged"),),
                  "a change that computes the same numbers", "blocks.0.mlp.hook_post", False)
    result = run_selftest(fixture, [noop, *by_name(["py-erf-polynomial"])])
    assert result.verdict == Verdict.DISAGREE and result.n_caught == 1
    assert any("not caught: py-noop" in why for why in result.failures())
    assert result.totals_line() == "mutants caught 1/2, localized 1/2 (50%), fp64-only 1"


def test_a_failing_control_fails_the_selftest(
    fixture: Fixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the unpatched implementation already disagrees, nothing the mutants show can be trusted."""
    broken = tmp_path / "reference"
    broken.mkdir()
    source = (TARGET_DIRS["reference"] / "model.py").read_text(encoding="utf-8")
    (broken / "model.py").write_text(by_name(["py-ln-eps"])[0].apply(source), encoding="utf-8")
    monkeypatch.setitem(parity_harness._tools.mutants.TARGET_DIRS, "reference", broken)
    result = run_selftest(fixture, by_name(["py-gelu-relu"]))
    assert not result.control_passed and result.verdict == Verdict.DISAGREE
    assert "control run of the unpatched reference failed" in result.failures()[0]
    assert "blocks.0.ln1.hook_scale" in result.failures()[0]
