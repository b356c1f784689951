"""A graph file is parsed and checked once per process and manifest hash (`_backends/onnx/load.py`'s `file_key`).

Every ONNX backend checks the graph it runs (onnx.checker, the contract, the embedded weights); on a
GPT-2-sized file that is seconds, so the second backend on the same file must not parse it again.
The counts are of onnx's parser and checker, as load_onnx calls them; the same file changed on disk
(with the manifest rehashed, as the fixture's hash check demands) is checked again and refused.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._core.errors import FixtureError
from parity_harness._fixture.fixture import load_fixture
from tests.helpers import rehash

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from parity_harness._backends.onnx.decode import checked_decode_graph  # noqa: E402
from parity_harness._backends.onnx.graph import check_onnx_file, onnx_file  # noqa: E402
from parity_harness._backends.onnx.onnx_reference_backend import OnnxReferenceBackend  # noqa: E402
from parity_harness._backends.onnx.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often onnx parsed a model from bytes ("parse") and ran its checker ("checker") during the test."""
    counts: Counter[str] = Counter()
    parse, check = onnx.load_model_from_string, onnx.checker.check_model

    def counted_parse(*args: Any, **kwargs: Any) -> Any:
        counts["parse"] += 1
        return parse(*args, **kwargs)

    def counted_check(*args: Any, **kwargs: Any) -> Any:
        counts["checker"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(onnx, "load_model_from_string", counted_parse)
    monkeypatch.setattr(onnx.checker, "check_model", counted_check)
    return counts


def _edit(path: Path, change: Any) -> None:
    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))


def _one_ulp_up(name: str) -> Any:
    from onnx import numpy_helper

    def change(model: Any) -> None:
        (init,) = [t for t in model.graph.initializer if t.name == name]
        value = numpy_helper.to_array(init).copy()
        value.flat[0] = np.nextafter(value.flat[0], np.float32(np.inf))
        init.CopyFrom(numpy_helper.from_array(value, name))

    return change


def test_a_second_check_of_the_same_file_parses_nothing(fixture_copy: Path, calls: Counter[str]) -> None:
    fixture = load_fixture(fixture_copy)
    OnnxRuntimeBackend().run(fixture, "fp32")  # onnx_file (weights) and check_onnx_file (contract)
    assert calls == {"parse": 1, "checker": 1}, "the first check parses the file once, for every check"
    OnnxRuntimeBackend().run(fixture, "fp32")
    again = load_fixture(fixture_copy)  # another Fixture of the same files: the same hashes
    check_onnx_file(onnx_file(again, "all_taps"), again, "all_taps")
    assert calls == {"parse": 1, "checker": 1}, "asked again, the checks read nothing"
    OnnxReferenceBackend().run(again, "fp32")  # it needs the parsed graph itself: one parse, nothing checked again
    assert calls == {"parse": 2, "checker": 1}
    checked_decode_graph(fixture)
    checked_decode_graph(again)
    assert calls == {"parse": 3, "checker": 2}, "the decode graph: once too"


def test_a_graph_outside_the_fixture_is_checked_every_time(fixture_copy: Path, toy_dir: Path,
                                                          calls: Counter[str]) -> None:
    fixture = load_fixture(fixture_copy)
    for _ in range(2):  # the manifest vouches for fixture_copy's files, not for this one
        check_onnx_file(toy_dir / "model.onnx", fixture, "all_taps")
    assert calls == {"parse": 2, "checker": 2}


def test_a_file_changed_on_disk_with_a_new_manifest_hash_is_checked_again(fixture_copy: Path,
                                                                          calls: Counter[str]) -> None:
    path = fixture_copy / "model.onnx"
    check_onnx_file(onnx_file(load_fixture(fixture_copy), "all_taps"), load_fixture(fixture_copy), "all_taps")
    assert calls == {"parse": 1, "checker": 1}
    _edit(path, _one_ulp_up("h__1__mlp__c_proj__weight"))
    rehash(fixture_copy)
    changed = load_fixture(fixture_copy)
    with pytest.raises(FixtureError, match=r"model\.onnx: initializer 'h__1__mlp__c_proj__weight' differs"):
        onnx_file(changed, "all_taps")
    assert calls["parse"] == 2
    _edit(path, lambda model: model.graph.output.remove(model.graph.output[0]))  # its contract now, not its weights
    rehash(fixture_copy)
    with pytest.raises(FixtureError, match=r"model\.onnx: graph outputs do not match .*missing \['hook_embed'\]"):
        check_onnx_file(path, load_fixture(fixture_copy), "all_taps")
    assert calls["parse"] == 3


def test_a_refused_contract_is_refused_again_from_its_verdict(fixture_copy: Path, calls: Counter[str]) -> None:
    path = fixture_copy / "model.onnx"

    def drop_last_output(model: Any) -> None:
        model.graph.output.remove(model.graph.output[len(model.graph.output) - 1])

    _edit(path, drop_last_output)
    rehash(fixture_copy)
    fixture = load_fixture(fixture_copy)
    assert onnx_file(fixture, "all_taps") == path  # the weights are the fixture's: onnx_file does not refuse it
    messages = []
    for _ in range(2):
        with pytest.raises(FixtureError) as err:
            check_onnx_file(path, fixture, "all_taps")
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "graph outputs do not match" in messages[0] and str(path) in messages[0]
    assert calls == {"parse": 1, "checker": 1}


def test_the_second_graph_of_the_same_weights_digests_only_its_own_tensors(
        fixture_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from parity_harness._backends.onnx import weights

    digested: Counter[str] = Counter()
    direct, transposed = weights.content_key, weights.transposed_key

    def counted_direct(value: np.ndarray) -> Any:
        digested["direct"] += 1
        return direct(value)

    def counted_transposed(value: np.ndarray) -> Any:
        digested["transposed"] += 1
        return transposed(value)

    monkeypatch.setattr(weights, "content_key", counted_direct)
    monkeypatch.setattr(weights, "transposed_key", counted_transposed)
    monkeypatch.setattr(weights, "_parameter_keys", {})  # the committed toy's weights: other tests digested them
    fixture = load_fixture(fixture_copy)
    onnx_file(fixture, "all_taps")
    n_params = len(fixture.weights())
    first = dict(digested)
    assert first["direct"] > n_params and first["transposed"] >= 1, first  # the tied unembedding's transpose
    digested.clear()
    onnx_file(fixture, "logits")
    floats = [t for t in onnx.load(str(fixture_copy / "model.logits.onnx")).graph.initializer
              if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)]
    assert dict(digested) == {"direct": len(floats)}, "the parameters' digests are the first graph's"
