"""onnxruntime in fp16: the fixture's model.onnx converted to float16 (`_backends/onnx/fp16.py`) on ORT CPU.

The honest run passes on the toy and on gpt2-mini; a planted error in the converted graph (which the
weights check, applied to the fp32 source, cannot see) is caught at its tap, and the same run without
it passes, so neither verdict is asserted by construction. fp32 stays the plain graph (tests/backends/test_onnx.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.onnx import fp16
from parity_harness._backends.onnx.onnxruntime_backend import OnnxRuntimeBackend
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._fixture.fixture import load_fixture
from tests.helpers import rehash

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test converts for itself (a planted graph must not be served to the next test)."""
    monkeypatch.setattr(fp16, "_converted", {})


def _scale(name: str, factor: float) -> Callable[[Any], None]:
    """An edit of the converted model: initializer `name` times `factor`, in its own dtype (float16)."""
    from onnx import numpy_helper

    def edit(model: Any) -> None:
        for init in model.graph.initializer:
            if init.name == name:
                value = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array((value * factor).astype(value.dtype), init.name))
                return
        raise AssertionError(f"no initializer {name!r}")

    return edit


# gpt2-mini: the session's export (tests/conftest.py) is tens of seconds, so that case is in the full set.
@pytest.mark.parametrize("which", ["toy", pytest.param("gpt2-mini", marks=pytest.mark.full)])
def test_onnxruntime_fp16_passes_on_the_toy_and_gpt2_mini(which: str, toy_dir: Path, request: pytest.FixtureRequest
                                                          ) -> None:
    root = toy_dir if which == "toy" else request.getfixturevalue("gpt2_mini")
    report = api.run("onnxruntime", root, ["fp16", "bf16", "fp32"], decoding=False, keep_outputs=True)
    assert report.passed, [d.message for d in report.divergences]
    ran = {(r.precision, r.status.value) for r in report.runs}
    assert {("fp16", "ran"), ("fp32", "ran"), ("bf16", "not_supported")} <= ran, ran
    out16, out32 = report.outputs[("onnxruntime", "fp16")], report.outputs[("onnxruntime", "fp32")]
    fixture = load_fixture(root)
    case = fixture.cases[-1].name
    for tap, a in out16[case].items():
        assert a.dtype == np.float32 and np.array_equal(a, a.astype(np.float16).astype(np.float32)), tap
    logits16, logits32 = out16[case]["logits"], out32[case]["logits"]
    assert not np.array_equal(logits16, logits32.astype(np.float16).astype(np.float32))  # not fp32 rounded at the end


def test_a_planted_error_in_the_converted_graph_is_caught_at_its_tap(toy_dir: Path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """The last MLP's output weights x 1.5 in the fp16 graph only: the fp32 source passes the weights check,
    so only the numbers can catch it, first at blocks.1.hook_mlp_out, in both golden tiers."""
    convert = fp16.convert
    monkeypatch.setattr(fp16, "convert", lambda data, path, names: convert(
        data, path, names, edit=_scale("h__1__mlp__c_proj__weight", 1.5)))
    report = api.run("onnxruntime", toy_dir, "fp16", decoding=False)
    assert not report.passed
    assert {(d.golden, d.tap) for d in report.divergences} == {("fp64", "blocks.1.hook_mlp_out"),
                                                                ("fp32", "blocks.1.hook_mlp_out")}
    monkeypatch.setattr(fp16, "_converted", {})
    monkeypatch.setattr(fp16, "convert", convert)
    assert api.run("onnxruntime", toy_dir, "fp16", decoding=False).passed  # the same run, unplanted


def test_the_weights_check_applies_to_the_fp32_source_in_fp16_too(fixture_copy: Path) -> None:
    """model.onnx made from other weights is refused before it is converted (FixtureError, exit 2)."""
    import onnx

    path = fixture_copy / "model.onnx"
    model = onnx.load(str(path))
    _scale("h__1__mlp__c_proj__weight", 2.0)(model)
    onnx.save(model, str(path))
    rehash(fixture_copy)
    with pytest.raises(FixtureError, match=r"initializer 'h__1__mlp__c_proj__weight' differs from parameter"):
        OnnxRuntimeBackend().run(load_fixture(fixture_copy), "fp16")
    assert fp16._converted == {}  # refused before any conversion


def test_an_output_left_in_float32_is_refused_in_one_line(toy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A converted graph whose taps are not float16 is the conversion's failure, not a number to judge."""
    import onnx

    convert = fp16.convert

    def keep_one(model: Any) -> None:
        model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT

    monkeypatch.setattr(fp16, "convert", lambda data, path, names: convert(data, path, names, edit=keep_one))
    with pytest.raises(BackendFailed, match=r"model\.onnx: the fp16 conversion left 1 outputs not float16"):
        OnnxRuntimeBackend().run(load_fixture(toy_dir), "fp16")


def test_the_graph_is_converted_once_per_content_not_per_path(toy_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    convert = fp16.convert

    def counted(data: bytes, path: Path, names: Any) -> bytes:
        calls.append(path)
        return convert(data, path, names)

    monkeypatch.setattr(fp16, "convert", counted)
    names = load_fixture(toy_dir).tap_names
    first = fp16.fp16_graph(toy_dir / "model.onnx", names)
    copy = tmp_path / "model.onnx"
    copy.write_bytes((toy_dir / "model.onnx").read_bytes())
    assert fp16.fp16_graph(copy, names) is first and calls == [toy_dir / "model.onnx"]
    copy.write_bytes((toy_dir / "model.logits.onnx").read_bytes())  # the same path, other content: converted anew
    with pytest.raises(BackendFailed, match=r"fp16 conversion of .*graph outputs do not match"):
        fp16.fp16_graph(copy, names)
    assert len(calls) == 2


def test_the_converter_import_leaves_sys_path_as_it_was() -> None:
    before = list(sys.path)
    fp16._converter()
    assert sys.path == before
