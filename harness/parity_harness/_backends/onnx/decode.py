"""The decoder-with-past ONNX graph (`model.decode.onnx`): its contract check, and decoding with it.

One decoding step of the reference model (`parity_reference.model.decode_step`), traced by torch.onnx's
dynamo exporter at opset `ONNX_OPSET`, weights embedded:

    inputs:  token int64 [1]; past.{i}.key, past.{i}.value float32 [H, P, d_head] per block
    outputs: logits float32 [V]; present.{i}.key, present.{i}.value float32 [H, P + 1, d_head]

P, the past length, is dynamic (1 to n_ctx - 1). The prefill is the all-taps graph (model.onnx):
its `blocks.{i}.attn.hook_k|hook_v` outputs, transposed to [H, T, d_head], are the first cache. A Llama
fixture's graph is `parity_reference.llama_model.decode_step`'s: the cache holds n_kv_heads heads
([n_kv_heads, P, d_head]) and its keys are after RoPE, so the first cache is `hook_rot_k|hook_v` transposed.
Decoding needs onnx and onnxruntime; the graph is written by
`parity_harness._authoring.onnx_export.export_decode_onnx`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._backends.onnx.graph import load_onnx
from parity_harness._backends.onnx.load import FileKey, file_key, first_line
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_reference.families import family_of

if TYPE_CHECKING:
    from parity_harness._backends.onnx.graph import Runner
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture
    from parity_reference.families import ModelConfig

TOKEN_INPUT = "token"


def input_names(n_layer: int) -> list[str]:
    return [TOKEN_INPUT] + [f"past.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def output_names(n_layer: int) -> list[str]:
    return ["logits"] + [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def check_decode_model(model: Any, path: Path, config: ModelConfig) -> None:
    """The decode graph's inputs and outputs are exactly the documented names; FixtureError otherwise."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    outputs = [o.name for o in model.graph.output]
    if inputs != input_names(config.n_layer) or outputs != output_names(config.n_layer):
        raise FixtureError(f"{path}: a decode graph takes {input_names(config.n_layer)} and returns "
                           f"{output_names(config.n_layer)}; this one takes {inputs} and returns {outputs}")


def decode_graph(fixture: Fixture) -> Path | None:
    """The fixture's decoder-with-past graph, if it lists one (files.decoding.onnx)."""
    files = fixture.files.get("decoding")
    name = files.get("onnx") if isinstance(files, dict) else None
    return fixture.root / name if isinstance(name, str) else None


_decode_checked: set[tuple[FileKey, int]] = set()  # (decode graph, n_layer) that passed `checked_decode_graph`


def checked_decode_graph(fixture: Fixture) -> Path:
    """The fixture's decode graph, checked: it parses and passes onnx.checker (`load_onnx`), keeps the decode
    contract (`check_decode_model`) and embeds the fixture's weights, the step graph's own copy
    (`check_graph_weights`). Once per process and file as the manifest hashes it; FixtureError otherwise."""
    from parity_harness._backends.onnx.weights import check_graph_weights

    path = decode_graph(fixture)
    if path is None:
        raise FixtureError(f"{fixture.manifest_path}: the fixture has no decode graph (files.decoding.onnx)")
    key = file_key(fixture, path)
    config = fixture.model.config
    if key is not None and (key, config.n_layer) in _decode_checked:
        return path
    model = load_onnx(path, key)
    check_decode_model(model, path, config)
    check_graph_weights(fixture, path, model)
    if key is not None:
        _decode_checked.add((key, config.n_layer))
    return path


def ort_decode(fixture: Fixture, requests: list[DecodeRequest]) -> DecodeOutput:
    """Decode with onnxruntime: prefill by model.onnx (hook_k, hook_v, logits), steps by model.decode.onnx."""
    from parity_harness._backends.onnx.graph import check_onnx_file, expected_outputs, onnx_file, ort_runner

    config = fixture.model.config
    path = checked_decode_graph(fixture)
    full = onnx_file(fixture, "all_taps")
    check_onnx_file(full, fixture, "all_taps")
    names = expected_outputs(fixture.tap_names, "all_taps")
    prefill = ort_runner(full)
    step = _ort_session(path)
    return decode_steps(config, path, requests, names, prefill, step)


Step = Callable[[np.ndarray, list[tuple[np.ndarray, np.ndarray]]], list[np.ndarray]]  # token (1,), cache -> values


def decode_steps(config: ModelConfig, path: Path, requests: list[DecodeRequest], names: Sequence[str], prefill: Runner,
                 step: Step, refuse_past_context: bool = False) -> DecodeOutput:
    """The decoding loop of every ONNX runtime: prefill by the all-taps graph (`prefill`, its outputs in `names`'
    order: the first cache is hook_k, hook_v transposed to [H, T, d_head]), then one `step` per token, fed or the
    runtime's own greedy pick. `refuse_past_context`: a step past n_ctx is a FixtureError before the runtime sees it
    (for a runtime that reads past its buffers rather than raising). Any runtime error is BackendFailed naming
    `path` and the prompt."""
    from parity_harness._fixture.decoding import steps_to_output

    # The taps the cache holds, from the family's table: GPT-2's hook_k; Llama's keys after RoPE (hook_rot_k).
    keys_tap, values_tap = family_of(config).decoding["cache_keys"], family_of(config).decoding["cache_values"]
    out: DecodeOutput = {}
    for req in requests:
        try:
            taps = dict(zip(names, prefill(np.asarray(req.prompt, dtype=np.int64)), strict=True))
            logits = np.asarray(taps["logits"])[-1]  # (V,)
            cache = [(np.asarray(taps[f"blocks.{i}.{keys_tap}"]).transpose(1, 0, 2).copy(),
                      np.asarray(taps[f"blocks.{i}.{values_tap}"]).transpose(1, 0, 2).copy())
                     for i in range(config.n_layer)]  # (T, H, dh) -> (H, T, dh)
            steps: list[tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]] = [(logits, cache)]
            for k in range(req.steps):
                token = req.feed[k] if req.feed is not None else int(np.argmax(logits))
                if refuse_past_context and len(req.prompt) + k >= config.n_ctx:
                    raise FixtureError(f"prompt {req.name!r}: step {k + 1} is past the context ({config.n_ctx})")
                values = step(np.asarray([token], dtype=np.int64), cache)
                logits = values[0]
                cache = [(values[1 + 2 * i], values[2 + 2 * i]) for i in range(config.n_layer)]
                steps.append((logits, cache))
        except FixtureError:
            raise
        except Exception as exc:  # the runtime raises many types; any crash is the backend's failure
            raise BackendFailed(f"{path}: prompt {req.name!r} failed: {first_line(exc)}") from None
        out[req.name] = steps_to_output(config.n_layer, steps)
    return out


def _ort_session(path: Path) -> Any:
    """token (1,), cache -> [logits, present keys and values ...] on onnxruntime CPU, one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: a failing node is the ParityError parity raises
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BackendFailed(f"{path}: onnxruntime cannot load the graph ({str(exc).strip()[:200]})") from None
    names = [i.name for i in session.get_inputs()]

    def run(token: np.ndarray, cache: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        feeds = {names[0]: token}
        for i, (k, v) in enumerate(cache):
            feeds[f"past.{i}.key"] = np.ascontiguousarray(k, dtype=np.float32)
            feeds[f"past.{i}.value"] = np.ascontiguousarray(v, dtype=np.float32)
        return [np.asarray(x, dtype=np.float32) for x in session.run(None, feeds)]

    return run


__all__ = ["Step", "check_decode_model", "checked_decode_graph", "decode_graph", "decode_steps", "input_names",
           "ort_decode", "output_names"]

