"""The Llama family through ONNX: the export (every tap a graph output, logits only) and the four ONNX backends.

A llama fixture is written into tmp_path (the seeded tiny Llama of
tests/families/llama/test_llama_reference.py: d_model 16, 2 blocks, 4 query heads sharing 2 key/value heads,
untied; weights float32, goldens from parity_reference.llama_model in each tier), then `export_onnx_for` adds its
two graphs. onnxruntime (every tap), onnxruntime-optimized (logits, probs), openvino and onnx-reference must each
agree with the fp32 goldens within the fixture's tolerance (1e-5), through the backends' own `run_cases` and the
harness's comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_reference.families import load_family
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from parity_reference import llama_model  # noqa: E402  (torch first: skipped without it)

CASES = {"ten": [1, 5, 3, 7, 2, 11, 0, 4, 9, 6], "one": [3], "full": [(7 * k) % 12 for k in range(16)]}
DTYPE = {"fp32": torch.float32, "fp64": torch.float64}


def _backend_classes() -> dict[str, Any]:
    from parity_harness._backends.onnx.onnx_reference_backend import OnnxReferenceBackend
    from parity_harness._backends.onnx.onnxruntime_backend import OnnxRuntimeBackend
    from parity_harness._backends.onnx.onnxruntime_optimized_backend import OnnxRuntimeOptimizedBackend
    from parity_harness._backends.onnx.openvino_backend import OpenVinoBackend

    return {"onnxruntime": OnnxRuntimeBackend, "onnxruntime-optimized": OnnxRuntimeOptimizedBackend,
            "openvino": OpenVinoBackend, "onnx-reference": OnnxReferenceBackend}


BACKENDS = _backend_classes()


def write_llama_fixture(root: Path, config: LlamaConfig = TOY_LLAMA) -> Path:
    """A llama fixture without graphs: weights (float32), fp32 and fp64 goldens of the reference, a sealed manifest."""
    from parity_harness._authoring.fixture_writer import default_tolerances, save_tensors
    from parity_harness._fixture.fixture import sha256_file
    from parity_harness._fixture.schema import SEAL_KEY, manifest_digest
    from parity_reference.grammar import VOCAB

    root.mkdir(parents=True, exist_ok=True)
    params = llama_model.init_params(config, 38, torch.float64, std=0.3)
    weights = {k: v.to(torch.float32).numpy() for k, v in params.items()}
    save_tensors(weights, root / "weights.safetensors")
    family = load_family("llama")
    taps = family.tap_names(config)
    for precision, dtype in DTYPE.items():
        p = {k: torch.tensor(v, dtype=dtype) for k, v in weights.items()}
        tensors = {}
        for name, tokens in CASES.items():
            ref = llama_model.run_with_taps(p, config, tokens)
            tensors.update({f"{name}/{tap}": np.ascontiguousarray(ref[tap].numpy()) for tap in taps})
        save_tensors(tensors, root / f"golden.{precision}.safetensors")
    files = {"weights": "weights.safetensors",
             "golden": {"fp32": "golden.fp32.safetensors", "fp64": "golden.fp64.safetensors"}}
    names = ["weights.safetensors", "golden.fp32.safetensors", "golden.fp64.safetensors"]
    manifest: dict[str, Any] = {
        "format": "parity-fixture", "format_version": 1, "family": "llama", "config": config.to_dict(),
        "vocab": list(VOCAB)[: config.vocab_size],
        "cases": [{"name": n, "kind": "random", "tokens": t, "text": ""} for n, t in CASES.items()],
        "taps": [{"name": t, "shape": family.shape_template(config, t)} for t in taps],
        "tolerances": default_tolerances(), "files": files,
        "sha256": {n: sha256_file(root / n) for n in names},
        "provenance": {"command": "tests/families/llama/test_llama_onnx.py"},
    }
    manifest[SEAL_KEY] = manifest_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return root


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama fixture with both graphs, exported once for the module (about 20 s on two shared cores)."""
    from parity_harness._authoring.onnx_export import export_onnx_for

    root = write_llama_fixture(tmp_path_factory.mktemp("llama") / "toy-llama")
    lines = export_onnx_for(root)
    assert [line.split(":")[0] for line in lines] == ["model.onnx", "model.logits.onnx"]
    return root


def _worst(fixture: Any, outputs: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """The worst |backend - golden fp32| per tap over every case, -inf/inf required to line up."""
    golden = fixture.golden("fp32")
    worst: dict[str, float] = {}
    for case in fixture.cases:
        for tap, value in outputs[case.name].items():
            want = np.asarray(golden[case.name][tap])
            assert value.shape == want.shape, (case.name, tap, value.shape, want.shape)
            inf = np.isinf(want)
            assert np.array_equal(np.isinf(value), inf), (case.name, tap)
            diff = float(np.max(np.abs(np.where(inf, 0.0, value) - np.where(inf, 0.0, want)), initial=0.0))
            worst[tap] = max(worst.get(tap, 0.0), diff)
    return worst


@pytest.mark.full
def test_the_llama_graph_has_every_tap_and_rope_constants(llama_dir: Path) -> None:
    import onnx

    from parity_harness._fixture.fixture import load_fixture

    fixture = load_fixture(llama_dir)
    assert fixture.family == "llama"
    model = onnx.load_model(str(llama_dir / "model.onnx"))
    assert [o.name for o in model.graph.output] == fixture.tap_names
    assert "blocks.1.attn.hook_rot_k" in fixture.tap_names and "blocks.1.mlp.hook_pre_linear" in fixture.tap_names
    assert [o.name for o in onnx.load_model(str(llama_dir / "model.logits.onnx")).graph.output] == ["logits"]
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"Cos", "Sin"}, ops  # the RoPE tables are constants, not computed in the graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    cos, sin = llama_model.rope_tables(TOY_LLAMA.n_ctx, TOY_LLAMA.d_head, TOY_LLAMA.rope_base, torch.float32)
    assert np.array_equal(inits["rope_cos"], cos.numpy()) and np.array_equal(inits["rope_sin"], sin.numpy())
    for entry in ("model.onnx", "model.logits.onnx"):
        assert entry in fixture.spec.hashes


@pytest.mark.full
@pytest.mark.parametrize("backend_name", ["onnxruntime", "onnxruntime-optimized", "openvino", "onnx-reference"])
def test_the_onnx_backends_pass_the_llama_fixture_in_fp32(llama_dir: Path, backend_name: str) -> None:
    from parity_harness._backends.registry import load_backend
    from parity_harness._fixture.fixture import load_fixture

    if backend_name == "openvino":
        pytest.importorskip("openvino")
    fixture = load_fixture(llama_dir)
    guarded = load_backend(backend_name)
    assert guarded.declined(fixture) is None  # the boundary lets a llama fixture through
    backend = BACKENDS[backend_name]()
    assert not backend.supports_decoding(fixture)
    outputs = dict(backend.run_cases(fixture, "fp32"))
    wanted = backend.supported_taps(fixture)
    assert all(sorted(taps) == sorted(wanted) for taps in outputs.values())
    if backend_name == "onnxruntime-optimized":
        assert sorted(wanted) == ["logits", "probs"]
    else:
        assert sorted(wanted) == sorted(fixture.tap_names)
    worst = _worst(fixture, outputs)
    tol = fixture.tolerances["fp32"]
    bad = {t: v for t, v in worst.items() if v > tol.for_tap(t).atol}  # atol alone: stricter than the judge
    assert not bad, bad
    print(backend_name, "worst", max(worst, key=worst.__getitem__), max(worst.values()))


@pytest.mark.full
def test_a_llama_graph_of_other_weights_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    """weights.py checks the llama graph against the llama fixture's own parameter table (not GPT-2's)."""
    import shutil

    from parity_harness._authoring.onnx_export import export_onnx
    from parity_harness._backends.onnx.graph import onnx_file
    from parity_harness._core.errors import FixtureError
    from parity_harness._fixture.fixture import load_fixture

    other = tmp_path / "other"
    shutil.copytree(llama_dir, other)
    fixture = load_fixture(other)
    weights = {k: np.array(v, dtype=np.float32) for k, v in fixture.weights().items()}
    weights["model.layers.1.mlp.up_proj.weight"][0, 0] += 1e-3
    export_onnx(weights, fixture.model.config, other / "model.logits.onnx", "logits")
    from parity_harness._authoring.fixture_writer import seal_manifest

    seal_manifest(other, rehash_files=True)
    with pytest.raises(FixtureError, match="up_proj"):
        onnx_file(load_fixture(other), "logits")


# -- fast: no export ---------------------------------------------------------------------------------------------


def _graph_of(initializers: dict[str, np.ndarray]) -> Any:
    """A one-node ONNX model whose initializers are `initializers` (what weights.py reads of a graph)."""
    import onnx
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in initializers.items()]
    node = helper.make_node("Identity", ["tokens"], ["logits"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, ["T"])],
                              [helper.make_tensor_value_info("logits", onnx.TensorProto.INT64, ["T"])], inits)
    return helper.make_model(graph)


def test_the_weights_check_takes_the_rope_tables_for_constants_not_parameters() -> None:
    """A RoPE table may have a parameter's shape ((n_ctx, d_head/2) in general; here made the RMSNorm gains' on
    purpose): under its own name it is a constant of the graph; under any other name it must be a parameter."""
    from parity_harness._backends.onnx.weights import ROPE_CONSTANTS, graph_weight_problem, parameter_name
    from parity_reference.llama_config import param_shapes

    config = LlamaConfig(vocab_size=12, d_model=4, n_head=2, n_kv_heads=1, d_mlp=8, n_ctx=16, n_layer=1)
    rng = np.random.default_rng(0)
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in param_shapes(config).items()}
    table = rng.standard_normal((config.d_model,)).astype(np.float32)  # the shape of every RMSNorm gain
    graph = {parameter_name(k): v for k, v in weights.items()}
    assert graph_weight_problem(_graph_of(graph), weights) is None
    for name in ROPE_CONSTANTS:
        assert graph_weight_problem(_graph_of({**graph, name: table}), weights) is None
    problem = graph_weight_problem(_graph_of({**graph, "some_constant": table}), weights)
    assert problem is not None and "some_constant" in problem  # any other such tensor is still checked
    changed = dict(graph)
    changed[parameter_name("model.layers.0.mlp.down_proj.weight")] = weights["model.layers.0.mlp.down_proj.weight"] * 2
    problem = graph_weight_problem(_graph_of(changed), weights)
    assert problem is not None and "down_proj" in problem


def test_the_graph_file_names_are_the_fixture_writers() -> None:
    """export_onnx_for names the graphs as the fixture writer does (graph.GRAPH_FILES, fixture_writer.ONNX_FILES)."""
    from parity_harness._authoring.fixture_writer import ONNX_FILES
    from parity_harness._backends.onnx.graph import GRAPH_FILES

    assert GRAPH_FILES == ONNX_FILES


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_the_onnx_backends_implement_llama(name: str) -> None:
    assert BACKENDS[name]().families == ("gpt2", "llama")


def test_a_llama_fixture_reaches_the_weights_check_with_its_own_parameters(tmp_path: Path) -> None:
    """weights.py asks the fixture's family for the parameter table (a llama fixture has no GPT-2 config)."""
    from parity_harness._backends.onnx.weights import check_graph_weights
    from parity_harness._core.errors import FixtureError
    from parity_reference.llama_config import param_shapes

    weights = {k: np.full(s, 0.5, np.float32) for k, s in param_shapes(TOY_LLAMA).items()}
    fixture = _StubFixture(weights, tmp_path)
    with pytest.raises(FixtureError, match=r"parameter 'model\.embed_tokens\.weight' is not in the graph"):
        check_graph_weights(fixture, tmp_path / "g.onnx", _graph_of({"x": np.ones(3, np.float32)}))  # type: ignore[arg-type]


class _StubFixture:
    """What check_graph_weights reads of a fixture."""

    def __init__(self, weights: dict[str, np.ndarray], root: Path) -> None:
        from parity_harness._fixture.model_spec import model_spec

        self.model = model_spec("llama", TOY_LLAMA)
        self._weights, self.root, self.weights_path = weights, root, root / "weights.safetensors"
        self.spec = type("Spec", (), {"hashes": {}})()

    def weights(self) -> dict[str, np.ndarray]:
        return self._weights

    def release_weights(self) -> None:
        pass


@pytest.mark.full
def test_the_gpt2_logits_graph_is_still_the_committed_bytes(tmp_path: Path) -> None:
    """The GPT-2 path of export_onnx is untouched by the Llama one: the toy's logits graph comes out as committed."""
    from parity_harness._authoring.onnx_export import export_onnx
    from parity_harness._fixture.fixture import load_fixture

    root = Path(__file__).resolve().parents[3] / "fixtures" / "toy"
    fixture = load_fixture(root)
    weights = {k: np.asarray(v, dtype=np.float32) for k, v in fixture.weights().items()}
    export_onnx(weights, fixture.config, tmp_path / "model.logits.onnx", "logits", lens_rows=fixture.lens_rows())
    assert (tmp_path / "model.logits.onnx").read_bytes() == (root / "model.logits.onnx").read_bytes()


@pytest.mark.full
def test_parity_run_passes_the_llama_fixture_on_the_onnx_backends_fp32_and_fp16(llama_dir: Path) -> None:
    """The whole run (boundary, judge, verdict) on the four ONNX backends; onnxruntime's fp16 graph too."""
    import subprocess
    import sys

    names = "onnxruntime,onnxruntime-optimized,openvino,onnx-reference"
    result = subprocess.run([sys.executable, "-m", "parity_harness", "run", "--fixture", str(llama_dir),
                             "--backends", names, "--precision", "fp32,fp16"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name, taps in (("onnxruntime", "48/48"), ("onnxruntime-optimized", "2/48"), ("openvino", "48/48"),
                       ("onnx-reference", "48/48")):
        assert any(line.split()[:5] == [name, "fp32", "vs", "fp32", taps] and " ok " in line for line in lines), name
    assert any(line.split()[:5] == ["onnxruntime", "fp16", "vs", "fp64", "48/48"] for line in lines)
    assert lines[-1].startswith("PASS:"), lines[-1]


@pytest.mark.full
def test_toy_llama_with_its_graphs_decodes_through_onnxruntime_and_openvino(tmp_path: Path) -> None:
    """fixtures/toy-llama copied, its three graphs added by export_onnx_for (the decode graph: llama_model.decode_step
    with the grouped-query cache), then `parity run`: every tap and the decoding goldens, step by step."""
    import shutil
    import subprocess
    import sys

    import onnx

    from parity_harness._authoring.onnx_export import export_onnx_for
    from parity_harness._fixture.fixture import load_fixture

    root = tmp_path / "toy-llama"
    shutil.copytree(Path(__file__).resolve().parents[3] / "fixtures" / "toy-llama", root)  # its graphs: written by
    fixture = load_fixture(root)  # `parity export --preset toy-llama`, which calls export_onnx_for
    assert export_onnx_for is not None and set(fixture.files["onnx"]) == {"all_taps", "logits"}
    assert "onnx" in fixture.files["decoding"]  # the decode graph is listed with the decoding goldens
    assert fixture.family == "llama" and fixture.decoding() is not None
    step = onnx.load_model(str(root / "model.decode.onnx"))
    config = fixture.model.config
    assert isinstance(config, LlamaConfig)
    past = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
    assert past["past.0.key"][0] == config.n_kv_heads and past["past.0.key"][2] == config.d_head  # grouped heads
    for name in ("onnxruntime", "openvino"):
        assert BACKENDS[name]().supports_decoding(fixture)
    result = subprocess.run([sys.executable, "-m", "parity_harness", "run", "--fixture", str(root), "--backends",
                             "onnxruntime,onnxruntime-optimized,openvino,onnx-reference"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in ("onnxruntime", "openvino"):
        line = next(line for line in lines if line.split()[:2] == [name, "fp32"])
        assert "48/48" in line and " ok, worst " in line, line  # taps and decoding both checked, both ok
    assert lines[-1].startswith("PASS:"), lines[-1]
