"""Diagnosis and reports: the first divergence paragraph, JUnit XML, Markdown, and the error-ladder plot."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from parity_harness._compare.judge import name_index
from parity_reference.config import GPTConfig
from parity_reference.taps import tap_names
from tests.helpers import assert_real_picture, perturb_weight, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

WEIGHT = "h.1.mlp.c_fc.weight"
FIRST = "blocks.1.mlp.hook_pre"
# What a change to block 1's c_fc can reach: its MLP and everything downstream of it, nothing upstream.
AFFECTED = ["blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post",
            "ln_final.hook_scale", "ln_final.hook_normalized", "logits", "probs", "logit_lens.2"]
TIERS = ["fp32_vs_fp32", "fp64_vs_fp64", "fp64_vs_fp32"]
# At the fp32 tolerance (atol 1e-5 + rtol 1e-5 x |b|) one reached tap stays within tolerance: the final
# LayerNorm's scale (magnitude ~13) moves by less than 1.4e-4. The fp64 tier sees every reached tap.
AFFECTED_BY_TIER = {
    "fp32_vs_fp32": [t for t in AFFECTED if t != "ln_final.hook_scale"],
    "fp64_vs_fp64": AFFECTED,
    "fp64_vs_fp32": [t for t in AFFECTED if t != "ln_final.hook_scale"],
}


@pytest.fixture(scope="module")
def perturbed_run(
    tmp_path_factory: pytest.TempPathFactory, local_toy: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One run of the reference on a fixture with one weight changed by 1e-3, writing every report.

    The fixture's goldens are made on this machine (`local_toy`), so upstream of the change the
    reference agrees exactly within a tier: bit-identity is a same-platform claim.
    """
    import shutil

    root = tmp_path_factory.mktemp("perturbed")
    fixture = root / "toy"
    shutil.copytree(local_toy, fixture)
    perturb_weight(fixture, WEIGHT, (0, 0), 1e-3)
    summary = root / "step_summary.md"
    summary.write_text("previous step\n")
    proc = run_cli("run", "--fixture", str(fixture), "--backends", "pytorch", "-q", "--json", str(root / "r.json"),
                   "--junit", str(root / "r.xml"), "--markdown", str(root / "r.md"), "--plot", str(root / "r.png"),
                   env={"GITHUB_STEP_SUMMARY": str(summary)})
    return root, proc


def test_first_divergence_names_the_tap_its_location_both_values_and_upstream(
    perturbed_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, proc = perturbed_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((root / "r.json").read_text())
    divs = report["first_divergence"]["pytorch"]
    assert {(d["precision"], d["golden"]) for d in divs} == {("fp32", "fp32"), ("fp64", "fp64"), ("fp64", "fp32")}
    golden = {p: load_file(str(root / "toy" / f"golden.{p}.safetensors")) for p in ("fp32", "fp64")}
    manifest = json.loads((root / "toy" / "manifest.json").read_text())
    cases = {c["name"]: c["tokens"] for c in manifest["cases"]}
    for d in divs:
        assert d["tap"] == FIRST and d["upstream_taps"] == tap_names(2).index(FIRST)
        # Only the c_fc column 0 changed: the worst cell is neuron 0, at some position of the case.
        assert d["axes"]["neuron"] == 0 and set(d["axes"]) == {"position", "neuron"}
        pos = d["axes"]["position"]
        assert d["index"] == [pos, 0]
        word = manifest["vocab"][cases[d["case"]][pos]]
        assert d["location"] == f"position {pos} ({word!r}), neuron 0"
        # Both values: the golden one is the fixture's, the actual one is off by about 1e-3 * |ln2 output|.
        assert d["expected"] == pytest.approx(float(golden[d["golden"]][f"{d['case']}/{FIRST}"][pos, 0]), rel=1e-12)
        assert d["actual"] != pytest.approx(d["expected"], abs=1e-5)
        # Upstream agrees: exactly within a tier (same code, same weights), within fp32 round-off across tiers.
        assert d["upstream_max_abs"] <= (0.0 if d["precision"] == d["golden"] else 1e-5)
        assert d["previous_tap"] == "blocks.1.ln2.hook_normalized"
        paragraph = next(ln for ln in proc.stdout.splitlines()
                         if ln.startswith(f"pytorch {d['precision']} vs {d['golden']}: first divergence"))
        assert f"first divergence at {FIRST}, case {d['case']}, position {pos} ({word!r}), neuron 0 [{pos}, 0]" \
            in paragraph
        assert f"got {d['actual']:.9g}, expected {d['expected']:.9g}" in paragraph
        assert f"Upstream agrees: the {d['upstream_taps']} taps before it agree" in paragraph
        assert "(the last one, blocks.1.ln2.hook_normalized," in paragraph


def test_junit_parses_and_fails_exactly_the_affected_taps(
    perturbed_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, _ = perturbed_run
    tree = ET.parse(root / "r.xml")
    top = tree.getroot()
    assert top.tag == "testsuites"
    every = top.findall("testsuite")
    suites = [s for s in every if not str(s.get("name")).endswith((".decoding", ".greedy"))]  # the forward taps
    assert [s.get("name") for s in suites] == [f"parity.pytorch.{t}" for t in TIERS]
    decoding_failures = sum(int(s.get("failures", 0)) for s in every if s not in suites)  # views/test_views_decoding.py
    failing: set[tuple[str, str]] = set()
    for suite in suites:
        cases = suite.findall("testcase")
        assert [c.get("name") for c in cases] == tap_names(2)
        assert {c.get("classname") for c in cases} == {suite.get("name")}
        n_fail = sum(1 for c in cases if c.find("failure") is not None)
        n_skip = sum(1 for c in cases if c.find("skipped") is not None)
        assert (int(suite.get("tests", -1)), int(suite.get("failures", -1)), int(suite.get("skipped", -1))) == \
            (len(cases), n_fail, n_skip)
        roots = []
        for c in cases:
            failure, skipped = c.find("failure"), c.find("skipped")
            if failure is not None:  # the tier's first divergence: the one failure, with its paragraph
                roots.append(str(c.get("name")))
                failing.add((str(c.get("classname")), str(c.get("name"))))
                assert failure.get("type") == "first-divergence" and failure.text
                assert "out of tolerance" in str(failure.get("message"))
                assert "first divergence at" in failure.text and "Upstream agrees" in failure.text
            elif skipped is not None and skipped.get("type") == "consequence":  # downstream of it
                failing.add((str(c.get("classname")), str(c.get("name"))))
                assert f"consequence of the first divergence at {roots[0]}" in str(skipped.get("message"))
                assert skipped.text and "out of tolerance" in skipped.text
        assert roots == [AFFECTED_BY_TIER[str(suite.get("name")).split(".")[-1]][0]]  # one root, the first tap
    assert sum(int(s.get("tests", 0)) for s in suites) == 3 * len(tap_names(2))
    assert int(top.get("tests", -1)) == sum(int(s.get("tests", 0)) for s in every)
    assert int(top.get("failures", -1)) == len(suites) + decoding_failures  # one failure per tier: its root
    # Exactly the taps the perturbation reaches, in every tier ...
    assert failing == {(f"parity.pytorch.{t}", tap) for t in TIERS for tap in AFFECTED_BY_TIER[t]}
    # ... which is also what the JSON report of the same run says failed.
    report = json.loads((root / "r.json").read_text())
    from_json = {(f"parity.{s['backend']}.{s['precision']}_vs_{s['golden']}", s["tap"])
                 for s in report["taps"] if s["status"] == "fail"}
    assert failing == from_json


def test_junit_marks_unsupported_taps_skipped(toy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.xml"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "onnxruntime-optimized", "-q", "--junit", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "parity.onnxruntime-optimized.fp32_vs_fp32"
    skipped = [c.get("name") for c in suite.findall("testcase") if c.find("skipped") is not None]
    assert "logits" not in skipped and "hook_embed" in skipped and int(suite.get("skipped", -1)) == len(skipped)
    assert int(suite.get("failures", -1)) == 0


def test_markdown_summary_and_github_step_summary(perturbed_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, _ = perturbed_run
    text = (root / "r.md").read_text()
    forward = text.split("### Decoding")[0]  # the decoding table follows (tests/views/test_views_decoding.py)
    rows = [ln for ln in forward.splitlines() if ln.startswith("| pytorch |")]
    assert len(rows) == 3
    for row, tier in zip(rows, TIERS, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        # backend, tier, verdict, passed, failed, not supported, worst tap, max error, tolerance used
        n_fail = len(AFFECTED_BY_TIER[tier])
        assert cells[1] == tier.replace("_", " ")
        assert cells[2] == "FAIL" and cells[3] == str(43 - n_fail) and cells[4] == str(n_fail) and cells[5] == "0"
        assert cells[6] == f"`{FIRST}`"
    assert "### First divergences" in text and f"first divergence at {FIRST}," in text
    assert "**FAIL:" in text
    step = (root / "step_summary.md").read_text()
    assert step.startswith("previous step\n") and text in step  # appended, not overwritten


def test_error_ladder_is_a_real_picture(perturbed_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    from parity_harness._views.plots import DPI, LADDER_SIZE

    root, _ = perturbed_run
    assert_real_picture(root / "r.png", (int(LADDER_SIZE[0] * DPI), int(LADDER_SIZE[1] * DPI)))


def test_plot_svg_by_extension_and_bad_extension(toy_dir: Path, tmp_path: Path) -> None:
    svg = tmp_path / "ladder.svg"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "numpy", "-q", "--plot", str(svg))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(list(root.iter())) > 100
    bad = run_cli("run", "--fixture", str(toy_dir), "--backends", "numpy", "-q", "--plot", str(tmp_path / "x.gif"))
    assert bad.returncode == 2 and "use .png or .svg" in bad.stderr and "Traceback" not in bad.stderr


def test_plot_without_matplotlib_exits_2_with_the_install_hint(toy_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "numpy", "--plot", str(tmp_path / "x.png"),
                   env={"PYTHONPATH": str(fake)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "parity: error: plotting needs matplotlib, which is not available; install with: "
        "pip install 'parity-harness[plot]'"]
    assert not (tmp_path / "x.png").exists()


def test_a_cell_is_named_by_its_taps_axes_from_the_family_table() -> None:
    from parity_harness._fixture.model_spec import model_spec

    model = model_spec("gpt2", GPTConfig(vocab_size=3, n_head=2))
    assert model.axis_names("blocks.0.hook_resid_pre") == ["position", "dim"]
    assert model.axis_names("blocks.0.attn.hook_z") == ["position", "head", "dim"]
    assert model.axis_names("blocks.0.attn.hook_pattern") == ["head", "position", "key_position"]
    assert model.axis_names("ln_final.hook_scale") == ["position", "scale"]
    vocab = [".", "the", "cat"]
    assert name_index(model.axis_names("blocks.0.attn.hook_pattern"), [1, 2, 0], (0, 1, 2), vocab) == (
        "head 1, position 2 ('cat'), key position 0 ('.')", {"head": 1, "position": 2, "key_position": 0})
    assert name_index(model.axis_names("logits"), [1, 2], (0, 1), vocab) == (
        "position 1 ('the'), token 2 ('cat')", {"position": 1, "token": 2})
    assert name_index(model.axis_names("blocks.1.attn.hook_z"), [0, 1, 3], (2,), vocab)[0] == \
        "position 0 ('cat'), head 1, dim 3"
    assert name_index(model.axis_names("ln_final.hook_scale"), [1, 0], (0, 1), vocab)[0] == "position 1 ('the')"
