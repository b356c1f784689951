"""The ONNX export and the three ONNX backends (onnxruntime, onnxruntime-optimized, onnx-reference).

A module-scoped fixture builds a random-weight toy fixture in a temporary directory and exports
both graphs into it once (the export costs ~10 s a graph). When fixtures/toy lists ONNX files,
the committed graphs are tested the same way (set PARITY_TEST_FIXTURE to test another directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from parity_harness._authoring.fixture_writer import ONNX_FILES
from parity_harness._authoring.onnx_export import check_onnx_against_golden, check_onnx_file
from parity_harness._backends.base import Backend
from parity_harness._backends.onnx.graph import INPUT_NAME, ONNX_OPSET, OnnxGraph, ort_runner
from parity_harness._backends.onnx.onnx_reference_backend import OnnxReferenceBackend
from parity_harness._backends.onnx.onnxruntime_backend import OnnxRuntimeBackend
from parity_harness._backends.onnx.onnxruntime_optimized_backend import OnnxRuntimeOptimizedBackend
from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import MANIFEST, Fixture, load_fixture
from tests.helpers import build_random_fixture, rehash, reseal, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

REPO = Path(__file__).resolve().parents[2]
COMMITTED = Path(os.environ.get("PARITY_TEST_FIXTURE", REPO / "fixtures" / "toy"))
ATOL = 1e-5
BACKENDS: list[type[Backend]] = [OnnxRuntimeBackend, OnnxRuntimeOptimizedBackend, OnnxReferenceBackend]


def _committed_has_onnx() -> bool:
    try:
        return bool(json.loads((COMMITTED / MANIFEST).read_text())["files"].get("onnx"))
    except (OSError, ValueError, KeyError, AttributeError):
        return False


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_fixture(tmp_path_factory.mktemp("onnx") / "toy", onnx=True)


@pytest.fixture(scope="module", params=["built", "committed"])
def fixture_dir(request: pytest.FixtureRequest, built_dir: Path) -> Path:
    """The freshly exported fixture, and fixtures/toy when it lists ONNX files."""
    if request.param == "committed":
        if not _committed_has_onnx():
            pytest.skip("fixtures/toy lists no ONNX files (run `parity export`)")
        return COMMITTED
    return built_dir


@pytest.fixture
def fixture(fixture_dir: Path) -> Fixture:
    return load_fixture(fixture_dir)


@pytest.fixture
def copy_dir(tmp_path: Path, built_dir: Path) -> Path:
    """A writable copy of the exported fixture."""
    dst = tmp_path / "toy"
    shutil.copytree(built_dir, dst)
    return dst


def _first_bad_cell(a: np.ndarray, b: np.ndarray, atol: float) -> str:
    """Empty when a matches b within atol (infinities in the same places), else what is wrong."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    if np.isnan(a).any():
        return "NaN"
    finite = np.isfinite(b)
    if not np.array_equal(a[~finite], b[~finite]):
        return "infinities differ"
    err = float(np.abs(a[finite].astype(np.float64) - b[finite]).max()) if finite.any() else 0.0
    return "" if err <= atol else f"max |diff| {err:.3e} > {atol:g}"


# -- 1. the exported graphs ------------------------------------------------------------------------


def test_graph_outputs_are_the_manifest_taps_in_order(fixture: Fixture) -> None:
    import onnx

    for kind, expected in (("all_taps", fixture.tap_names), ("logits", ["logits"])):
        path = fixture.onnx_path(kind)
        assert path is not None
        model = onnx.load(str(path))
        assert [o.name for o in model.graph.output] == expected
        assert [i.name for i in model.graph.input] == [INPUT_NAME]
        tokens_type = model.graph.input[0].type.tensor_type
        assert tokens_type.elem_type == onnx.TensorProto.INT64
        assert len(tokens_type.shape.dim) == 1 and tokens_type.shape.dim[0].dim_param  # dynamic T
        assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {ONNX_OPSET}
        assert not list(path.parent.glob(path.name + ".data")), "external data written next to the graph"
        check_onnx_file(path, fixture, kind)  # type: ignore[arg-type]


def test_every_length_from_1_to_the_context_matches_the_reference(fixture: Fixture) -> None:
    import torch

    from parity_reference.model import run_with_taps

    params = {k: torch.from_numpy(v.copy()) for k, v in fixture.weights().items()}
    paths = {kind: fixture.onnx_path(kind) for kind in ONNX_FILES}
    all_taps, logits_only = (ort_runner(p) for p in paths.values() if p is not None)
    rng = np.random.default_rng(0)
    problems = []
    for t in range(1, fixture.config.n_ctx + 1):
        tokens = rng.integers(0, fixture.config.vocab_size, size=t).astype(np.int64)
        ref = {k: v.numpy() for k, v in run_with_taps(params, fixture.config, tokens.tolist()).items()}
        outputs = dict(zip(fixture.tap_names, all_taps(tokens), strict=True))
        outputs["logits (logits graph)"] = logits_only(tokens)[0]
        for tap, value in outputs.items():
            bad = _first_bad_cell(value, ref[tap.split(" ")[0]], ATOL)
            if bad:
                problems.append(f"T={t} {tap}: {bad}")
    assert not problems, problems[:10]


# -- 2. the backends -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend_cls", BACKENDS, ids=lambda b: b.name)
def test_backend_agrees_with_golden_fp32(backend_cls: type[Backend], fixture: Fixture) -> None:
    backend = backend_cls()
    assert backend.precisions[0] == "fp32" and "fp64" not in backend.precisions  # onnxruntime: fp16 too
    assert backend.missing_dependencies() == []
    taps = backend.supported_taps(fixture)
    out = backend.run(fixture, "fp32")
    golden = fixture.golden("fp32")
    assert set(out) == {c.name for c in fixture.cases}
    problems = []
    for case in fixture.cases:
        assert set(out[case.name]) >= set(taps)
        for tap in taps:
            bad = _first_bad_cell(out[case.name][tap], golden[case.name][tap], ATOL)
            if bad:
                problems.append(f"{case.name}/{tap}: {bad}")
    assert not problems, problems[:10]


def test_optimized_backend_supports_only_logits_and_probs(fixture: Fixture) -> None:
    assert OnnxRuntimeOptimizedBackend().supported_taps(fixture) == ["logits", "probs"]


@pytest.mark.parametrize("backend_cls", BACKENDS, ids=lambda b: b.name)
def test_no_onnx_files_says_run_parity_export(backend_cls: type[Backend], copy_dir: Path) -> None:
    manifest = json.loads((copy_dir / MANIFEST).read_text())
    del manifest["files"]["onnx"]
    for name in ONNX_FILES.values():
        del manifest["sha256"][name]
    reseal(copy_dir, manifest)
    with pytest.raises(FixtureError, match="parity export"):
        backend_cls().run(load_fixture(copy_dir), "fp32")


# -- 3. broken graph files -------------------------------------------------------------------------

CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "garbage": lambda b: b"this is not an onnx file\x00\xff" * 10,
    "truncated-half": lambda b: b[: len(b) // 2],
    "truncated-100": lambda b: b[:100],
    "empty": lambda b: b"",
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=list(CORRUPTIONS))
@pytest.mark.parametrize("backend_cls", BACKENDS, ids=lambda b: b.name)
def test_corrupt_onnx_file_is_a_fixture_error_naming_the_file(
    backend_cls: type[Backend], corrupt: str, copy_dir: Path
) -> None:
    kind: OnnxGraph = "logits" if backend_cls is OnnxRuntimeOptimizedBackend else "all_taps"
    path = copy_dir / ONNX_FILES[kind]
    path.write_bytes(CORRUPTIONS[corrupt](path.read_bytes()))
    rehash(copy_dir)  # the hash matches: only the ONNX check can catch it
    fixture = load_fixture(copy_dir)
    with pytest.raises(FixtureError, match=str(path).replace("\\", "\\\\")):
        check_onnx_file(path, fixture, kind)  # type: ignore[arg-type]
    with pytest.raises(FixtureError) as err:
        backend_cls().run(fixture, "fp32")
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_cli_run_on_a_truncated_onnx_file_exits_2_with_one_line(copy_dir: Path) -> None:
    path = copy_dir / "model.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    rehash(copy_dir)
    proc = run_cli("run", "--fixture", str(copy_dir), "--backends", "onnxruntime")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, (proc.returncode, output[-3000:])
    assert "Traceback" not in output, output
    naming = [ln for ln in output.splitlines() if str(path) in ln]
    assert len(naming) == 1 and "not a readable ONNX file" in naming[0], output


def _edit_graph(path: Path, change: Callable[[Any], None]) -> None:
    import onnx

    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))


def _drop_output(model: Any, name: str) -> None:
    (out,) = [o for o in model.graph.output if o.name == name]
    model.graph.output.remove(out)


def _rename_output(model: Any, old: str, new: str) -> None:
    for node in model.graph.node:
        node.output[:] = [new if o == old else o for o in node.output]
        node.input[:] = [new if i == old else i for i in node.input]
    for out in model.graph.output:
        if out.name == old:
            out.name = new


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (lambda m: _drop_output(m, "blocks.1.attn.hook_z"), ["missing", "blocks.1.attn.hook_z"]),
        (lambda m: _rename_output(m, "probs", "p"), ["missing ['probs']", "extra ['p']"]),
        (lambda m: m.graph.output.insert(0, m.graph.output.pop()), ["wrong order"]),
    ],
    ids=["missing", "renamed", "reordered"],
)
def test_graph_whose_outputs_differ_from_the_manifest_is_refused(
    change: Callable[[Any], None], needles: list[str], copy_dir: Path
) -> None:
    path = copy_dir / "model.onnx"
    _edit_graph(path, change)
    rehash(copy_dir)
    fixture = load_fixture(copy_dir)
    with pytest.raises(FixtureError) as err:
        OnnxRuntimeBackend().run(fixture, "fp32")
    for needle in [str(path), "graph outputs do not match", *needles]:
        assert needle in str(err.value), (needle, str(err.value))


def test_one_graph_in_place_of_the_other_is_refused(copy_dir: Path, built_dir: Path) -> None:
    shutil.copy(copy_dir / "model.logits.onnx", copy_dir / "model.onnx")
    rehash(copy_dir)
    fixture = load_fixture(copy_dir)
    with pytest.raises(FixtureError, match=r"missing \['hook_embed'"):
        OnnxReferenceBackend().run(fixture, "fp32")
    with pytest.raises(FixtureError, match=r"extra \['hook_embed'"):
        check_onnx_file(built_dir / "model.onnx", fixture, "logits")


# -- 4. `parity export --check`'s ONNX step ---------------------------------------------------------


def test_check_against_golden_passes_on_an_exported_fixture(fixture: Fixture) -> None:
    lines = check_onnx_against_golden(fixture)
    assert [ln.split(":")[0] for ln in lines] == list(ONNX_FILES.values())


def _scale_initializer(name: str) -> Callable[[Any], None]:
    from onnx import numpy_helper

    def perturb(model: Any) -> None:
        for init in model.graph.initializer:
            if init.name == name:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
                return
        raise AssertionError([i.name for i in model.graph.initializer])

    return perturb


def test_check_against_golden_fails_when_the_graph_computes_something_else(copy_dir: Path) -> None:
    # A constant of the graph, not a weight (the positions' frequencies) x 2: the logits drift.
    _edit_graph(copy_dir / "model.logits.onnx", _scale_initializer("pow_1"))
    rehash(copy_dir)
    with pytest.raises(FixtureError, match=r"model\.logits\.onnx:logits"):
        check_onnx_against_golden(load_fixture(copy_dir))


def test_check_against_golden_refuses_a_graph_made_from_other_weights(copy_dir: Path) -> None:
    # The last MLP's output weights x 2: refused by the weights check before any number is compared.
    _edit_graph(copy_dir / "model.logits.onnx", _scale_initializer("h__1__mlp__c_proj__weight"))
    rehash(copy_dir)
    with pytest.raises(FixtureError, match=r"model\.logits\.onnx: initializer 'h__1__mlp__c_proj__weight' differs "
                       r"from parameter 'h\.1\.mlp\.c_proj\.weight'.*weights\.safetensors"):
        check_onnx_against_golden(load_fixture(copy_dir))


# -- 5. running without torch ---------------------------------------------------------------------

NO_TORCH = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # `import torch` now raises ImportError
    import numpy as np
    from parity_harness._fixture.fixture import load_fixture
    from parity_harness._backends.onnx.onnxruntime_backend import OnnxRuntimeBackend
    fixture = load_fixture(sys.argv[1])
    out = OnnxRuntimeBackend().run(fixture, "fp32")
    golden = fixture.golden("fp32")
    worst = max(float(np.abs(out[c.name]["logits"] - golden[c.name]["logits"]).max()) for c in fixture.cases)
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("torch was importable")
    print(f"worst {worst!r}")
    """
)


def test_model_onnx_runs_where_torch_cannot_be_imported(fixture_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(fixture_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = float(proc.stdout.split()[-1])
    assert worst <= ATOL, worst


def test_importing_the_backends_imports_no_runtime() -> None:
    code = (
        "import sys\n"
        "import parity_harness._backends.onnx.onnxruntime_backend\n"
        "import parity_harness._backends.onnx.onnxruntime_optimized_backend\n"
        "import parity_harness._backends.onnx.onnx_reference_backend, parity_harness._authoring.onnx_export\n"
        "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
