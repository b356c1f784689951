"""Fixtures a user can publish: no machine path in any file, the same graph bytes from any directory (issue 43).

Every graph parity writes goes through `_backends/onnx/clean.py`'s `graph_bytes` (docs/onnx.md, "What a graph
holds"): the exporter's node metadata (stack traces naming the checkout, Python object addresses) is dropped,
what the graph needs to run and the user's own model metadata stay. The committed fixtures and test vectors
were rewritten that way: each committed graph is a fixed point of the cleaner.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import rehash

pytest.importorskip("onnx")

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = (REPO / "fixtures", REPO / "tests" / "data")
# An absolute path on some machine: POSIX home and temporary directories, this machine's /work, macOS
# homes, a Windows drive with a directory (`C:\\` alone is 3 bytes: random float bytes hold it by chance),
# an installed package, a Python traceback line.
ABSOLUTE_PATH = re.compile(rb'/home/|/tmp/|/work/|/Users/|[A-Za-z]:\\[\w .-]+\\|site-packages|File "/')
TRACE = 'File "/home/someone/parity/harness/parity_harness/_authoring/onnx_export.py", line 111, in forward'


def _published_files() -> list[Path]:
    files = sorted(p for top in PUBLISHED for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert len(files) >= 20, files  # the toy, the stress fixture and toy-avx512 are all there
    return files


def _graphs() -> list[Path]:
    graphs = [p for p in _published_files() if p.suffix == ".onnx"]
    assert len(graphs) >= 7, graphs
    return graphs


def test_no_committed_fixture_file_holds_an_absolute_path() -> None:
    found = {str(p.relative_to(REPO)): sorted({m.group().decode(errors="replace")
                                               for m in ABSOLUTE_PATH.finditer(p.read_bytes())})
             for p in _published_files()}
    assert not {name: hits for name, hits in found.items() if hits}


def test_toy_model_onnx_is_under_45_kb() -> None:
    size = (REPO / "fixtures" / "toy" / "model.onnx").stat().st_size
    assert size < 45_000, size


@pytest.mark.parametrize("name", [str(p.relative_to(REPO)) for p in _graphs()])
def test_every_committed_graph_is_already_clean(name: str) -> None:
    """Cleaning a committed graph changes nothing: no exporter metadata is left, in any graph or node."""
    import onnx

    from parity_harness._backends.onnx.clean import graph_bytes

    data = (REPO / name).read_bytes()
    model = onnx.load_model_from_string(data)
    assert not any(n.metadata_props or n.doc_string for n in model.graph.node)
    assert not model.graph.metadata_props
    assert graph_bytes(model) == data


def _dirty_model() -> Any:
    """A small valid graph carrying what torch.onnx's dynamo exporter writes, a subgraph, and user metadata."""
    from onnx import TensorProto, helper

    def meta(proto: Any, **props: str) -> Any:
        for key, value in props.items():
            proto.metadata_props.add(key=key, value=value)
        return proto

    then = helper.make_graph([meta(helper.make_node("Identity", ["x"], ["t"]), namespace="<fn at 0x7f9f0>")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], doc_string=TRACE)],
                              "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    nodes = [
        meta(helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), **{
            "pkg.torch.onnx.stack_trace": TRACE, "pkg.torch.onnx.fx_node": "%sum : call_function",
            "pkg.torch.onnx.class_hierarchy": "['parity.TapsModule']",
            "namespace": ": TapsModule/sum: <function sym_max at 0x7f9f12345678>"}),
        helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], doc_string=TRACE)
    meta(graph, **{"pkg.torch.export.ExportedProgram.graph_signature": "b_w: BUFFER"})
    meta(graph.input[0], **{"pkg.torch.onnx.original_node_name": "x"})
    model = helper.make_model(graph, producer_name="pytorch", producer_version="2.13.0",
                              opset_imports=[helper.make_opsetid("", 18)])
    meta(model, **{"name": "my-model", "pkg.torch.onnx.version": "2.13", "where": TRACE})
    return model


def test_graph_bytes_drops_exporter_metadata_and_keeps_what_runs() -> None:
    import onnx

    from parity_harness._backends.onnx.clean import graph_bytes

    data = graph_bytes(_dirty_model())
    clean = onnx.load_model_from_string(data)
    onnx.checker.check_model(clean, full_check=True)
    assert {(p.key, p.value) for p in clean.metadata_props} == {("name", "my-model")}  # the user's own
    assert (clean.producer_name, clean.producer_version, clean.graph.name) == ("pytorch", "2.13.0", "main_graph")
    assert [n.op_type for n in clean.graph.node] == ["ReduceSum", "Cast", "If"]
    assert [a.name for a in clean.graph.node[2].attribute] == ["else_branch", "then_branch"]
    for text in (b"0x7f9f", b"/home/someone", b"stack_trace", b"namespace", b"graph_signature", b"original_node"):
        assert text not in data, text
    assert graph_bytes(clean) == data  # a fixed point


def _dirty_copy(src: Path, dst: Path) -> Path:
    """A copy of fixture `src` whose model.onnx carries exporter metadata with a path (re-hashed, re-sealed)."""
    import onnx

    shutil.copytree(src, dst)
    model = onnx.load_model(str(dst / "model.onnx"))
    for node in model.graph.node:
        node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value=TRACE)
        node.metadata_props.add(key="namespace", value="<function sym_max at 0x7f9f12345678>")
    (dst / "model.onnx").write_bytes(model.SerializeToString())
    rehash(dst)
    return dst


def test_the_fp16_conversion_holds_no_exporter_metadata(tmp_path: Path, toy_dir: Path) -> None:
    pytest.importorskip("onnxruntime")
    from parity_harness._backends.onnx import fp16
    from parity_harness._fixture.fixture import load_fixture

    root = _dirty_copy(toy_dir, tmp_path / "toy")
    path = root / "model.onnx"
    assert b"0x7f9f12345678" in path.read_bytes()  # the planted metadata is there to be dropped
    data = fp16.convert(path.read_bytes(), path, load_fixture(root).tap_names)
    assert b"0x7f9f12345678" not in data and b"/home/someone" not in data and b"stack_trace" not in data


def test_the_webgpu_backend_hands_the_browser_a_clean_graph(tmp_path: Path, toy_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from parity_harness._backends.browser import driver, onnxruntime_webgpu_backend
    from parity_harness._fixture.fixture import load_fixture

    root = _dirty_copy(toy_dir, tmp_path / "toy")
    served: list[bytes] = []

    class Served(Exception):
        pass

    def run_to_file(name: str, package: str, fixture_root: Path, argv: list[str]) -> Any:
        served.append(Path(argv[3]).read_bytes())
        raise Served

    monkeypatch.setattr(driver, "run_to_file", run_to_file)
    with pytest.raises(Served):
        onnxruntime_webgpu_backend.OnnxRuntimeWebGpuBackend().run(load_fixture(root), "fp32")
    assert served and b"0x7f9f12345678" not in served[0] and b"stack_trace" not in served[0]


def _export(cwd: Path) -> Path:
    """`parity export --preset gpt2-mini` run from `cwd`, as a user would, into `cwd`/fixture."""
    proc = subprocess.run([sys.executable, "-m", "parity_harness", "export", "--preset", "gpt2-mini",
                           "--fixture", str(cwd / "fixture")], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd / "fixture"


@pytest.mark.full  # two exports of gpt2-mini with both ONNX graphs: about 30 s
def test_gpt2_mini_exports_the_same_bytes_from_any_directory_and_names_none(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import parity_harness
    import parity_reference

    one, two = tmp_path / "first", tmp_path / "second dir with a space"
    one.mkdir()
    two.mkdir()
    first, second = _export(one), _export(two)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    graphs = [n for n in names if n.endswith(".onnx")]
    assert graphs == ["model.logits.onnx", "model.onnx"], names
    for name in graphs:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    source = [Path(parity_harness.__file__).resolve().parent, Path(parity_reference.__file__).resolve().parent]
    forbidden = {str(p) for p in (one, two, *source, *(s.parent for s in source), *(s.parent.parent for s in source))}
    forbidden |= {f.replace("/", "\\") for f in forbidden}
    for root in (first, second):
        for path in root.iterdir():
            data = path.read_bytes()
            leaks = [f for f in forbidden if f.encode() in data]
            assert not leaks, (path.name, leaks)
            assert not ABSOLUTE_PATH.search(data), (path.name, ABSOLUTE_PATH.search(data))


def test_parity_s_own_fixtures_are_shown_by_name_and_the_user_s_as_given(tmp_path: Path) -> None:
    from parity_harness._core.resources import PACKAGE_DIR, stress_fixture_dir, toy_fixture_dir
    from parity_harness._core.shown_path import shown_fixture

    assert shown_fixture(toy_fixture_dir()) == "fixtures/toy"
    assert shown_fixture(str(stress_fixture_dir()) + "/") == "fixtures/toy-stress"
    assert shown_fixture(PACKAGE_DIR / "_fixture") == "<parity>/_fixture"
    for theirs in ("../my-port/fixture", str(tmp_path / "a dir" / "fx"), "fixtures/toy-copy", ""):
        assert shown_fixture(theirs) == theirs


# The default fixture is not one the user pointed at: its path is parity's installation (issue 43, item 3).
def test_a_report_of_the_default_fixture_names_no_installation_path(tmp_path: Path) -> None:
    from parity_harness._core.resources import PACKAGE_DIR, toy_fixture_dir

    proc = subprocess.run([sys.executable, "-m", "parity_harness", "run", "--backends", "numpy", "-q", "--json",
                           "r.json", "--markdown", "r.md", "--junit", "r.xml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = {str(PACKAGE_DIR), str(toy_fixture_dir().resolve().parent)}
    for name in ("r.json", "r.md", "r.xml"):
        text = (tmp_path / name).read_text()
        assert not [p for p in installed if p in text], (name, installed)
