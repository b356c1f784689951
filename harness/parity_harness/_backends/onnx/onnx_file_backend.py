"""`onnx-file`: any ONNX graph of the fixture's model, from any exporter, with no plugin (`parity run --onnx FILE`).

The graph a user ships comes from optimum, a vendor toolchain or their own export: its tensors have their own
names and layouts, and its weights may differ from the fixture's. This backend runs it on onnxruntime's CPU (one
thread, graph optimizations off, so every node's tensor is the one the graph says) with every float tensor
exposed as an output, and finds which tensor stands for which tap (match.py): by a name map the user gives
(`--onnx-map FILE`, JSON {tap: tensor}), or by value, in dataflow order. The taps it finds nothing for are "not
supported"; which tensor stood for which tap is said in the report (`tap_sources`). It does not refuse a graph
whose weights differ from the fixture's: `build_info` says how many of the fixture's weights the graph holds.

Inputs: token ids, int64, of shape [T] or [1, T] (the first input); an `attention_mask` of ones and
`position_ids` 0..T-1 where the graph asks for them. Anything else is one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision, checked_tokens
from parity_harness._backends.onnx.match import (
    TapSource,
    as_tap,
    expose_all,
    match_taps,
    producers,
    read_mask,
    unit_axes,
)
from parity_harness._core.errors import BackendFailed, FixtureError, ParityError
from parity_harness._fixture.fixture import Fixture

INT64 = 7  # onnx.TensorProto.INT64
EXTRA_INPUTS = ("attention_mask", "position_ids")


class OnnxFileBackend(Backend):
    """A user's ONNX graph on onnxruntime, its tensors matched to the taps by value or by a name map."""

    name = "onnx-file"
    description = "any ONNX graph of the fixture's model (parity run --onnx FILE), tensors matched to taps by value"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires = ("onnx", "onnxruntime")
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")
    install_hint = "pip install 'parity-harness[onnx]'"
    runs_graph = True
    by_default = False

    def __init__(self, path: str | Path | None = None, name_map: Mapping[str, str] | None = None) -> None:
        self.path = Path(path) if path is not None else Path()
        self.given = path is not None
        self.name_map = dict(name_map) if name_map is not None else None
        self._model: Any = None
        self._sources: dict[str, TapSource] | None = None
        self._weights_note = ""

    def declines(self, fixture: Fixture) -> str | None:
        return None if self.given else "no graph was given (--onnx FILE; the API's onnx=)"

    # -- the graph -------------------------------------------------------------------------------------------

    def model(self) -> Any:
        """The graph, parsed and checked once (FixtureError naming the file if unusable)."""
        if self._model is None:
            from parity_harness._backends.onnx.load import load_onnx

            self._model = load_onnx(self.path)
        return self._model

    def _session(self) -> tuple[Any, list[str], list[str]]:
        import onnxruntime as ort

        exposed, order = expose_all(self.model())
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 4  # fatal only: a failing node is the ParityError parity raises
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph's own nodes
        try:
            session = ort.InferenceSession(exposed.SerializeToString(), sess_options=options,
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own exception types
            raise BackendFailed(f"{self.path}: onnxruntime cannot load the graph ({_first(exc)})") from None
        return session, [o.name for o in session.get_outputs()], order

    def _feeds(self, tokens: list[int]) -> dict[str, np.ndarray]:
        inputs = list(self.model().graph.input)
        initializers = {t.name for t in self.model().graph.initializer}
        inputs = [i for i in inputs if i.name not in initializers]
        first = inputs[0]
        kind = first.type.tensor_type.elem_type
        rank = len(first.type.tensor_type.shape.dim)
        if kind != INT64 or rank not in (1, 2):
            raise FixtureError(f"{self.path}: its first input {first.name!r} is not token ids (int64, [T] or [1, T])")
        ids = np.asarray(tokens, dtype=np.int64)
        feeds = {first.name: ids if rank == 1 else ids[None, :]}
        for extra in inputs[1:]:
            if extra.name == "attention_mask":
                feeds[extra.name] = np.ones_like(feeds[first.name])
            elif extra.name == "position_ids":
                feeds[extra.name] = np.arange(len(tokens), dtype=np.int64).reshape(feeds[first.name].shape)
            else:
                raise FixtureError(f"{self.path}: input {extra.name!r} is not one parity can feed (token ids first, "
                                   f"then optionally {', '.join(EXTRA_INPUTS)})")
        return feeds

    def _run_all(self, session: Any, names: list[str], tokens: list[int], case: str) -> dict[str, np.ndarray]:
        try:
            values = session.run(None, self._feeds(tokens))
        except ParityError:
            raise
        except Exception as exc:
            raise BackendFailed(f"{self.path}: case {case!r} (T={len(tokens)}) failed: {_first(exc)}") from None
        return {n: np.asarray(v) for n, v in zip(names, values, strict=True)}

    # -- the taps --------------------------------------------------------------------------------------------

    def sources(self, fixture: Fixture) -> dict[str, TapSource]:
        """{tap: the tensor standing for it}, found once per backend instance (on the fixture's longest case)."""
        if self._sources is None:
            session, names, order = self._session()
            model = self.model()
            made_by = producers(model)
            outputs = [o.name for o in model.graph.output]
            case = max(fixture.cases, key=lambda c: len(c.tokens))
            values = self._run_all(session, names, list(case.tokens), case.name)
            goldens = {tap: np.asarray(fixture.golden_tap("fp32", case.name, tap)) for tap in fixture.tap_names}
            if self.name_map is not None:
                self._sources = self._named(values, goldens, made_by)
            else:
                atols = {tap: fixture.tolerances["fp32"].for_tap(tap).atol + fixture.tolerances["fp32"].for_tap(
                    tap).rtol * float(np.max(np.abs(g[np.isfinite(g)]), initial=0.0)) for tap, g in goldens.items()}
                self._sources = match_taps(values, order, fixture.tap_names, goldens, atols, outputs, made_by)
            self._weights_note = _weights_held(model, fixture)
        return self._sources

    def _named(self, values: Mapping[str, np.ndarray], goldens: Mapping[str, np.ndarray],
               made_by: Mapping[str, tuple[str, str]]) -> dict[str, TapSource]:
        from parity_harness._backends.onnx.match import _best

        assert self.name_map is not None
        out: dict[str, TapSource] = {}
        for tap, tensor in self.name_map.items():
            if tap not in goldens:
                raise FixtureError(f"onnx map: {tap!r} is not a tap of the fixture")
            if tensor not in values:
                raise FixtureError(f"onnx map: tap {tap!r}: the graph computes no float tensor named {tensor!r}")
            best = _best(values, [tensor], goldens[tap])
            if best is None:
                raise FixtureError(f"onnx map: tap {tap!r}: tensor {tensor!r} has shape {values[tensor].shape}, "
                                   f"not {goldens[tap].shape}'s size")
            node, op = made_by.get(tensor, ("", "input"))
            out[tap] = TapSource(tensor, node, op, best[0][1], "name", unit_axes(values[tensor]))
        return out

    def supported_taps(self, fixture: Fixture) -> list[str]:
        found = self.sources(fixture)
        return [tap for tap in fixture.tap_names if tap in found]

    def tap_sources(self, fixture: Fixture) -> dict[str, str]:
        """{tap: "tensor (op node), how it was found"}: what the report says stood for each tap."""
        return {tap: f"{s.tensor} ({s.op} {s.node}; {s.how})" for tap, s in self.sources(fixture).items()}

    def locate_op(self, fixture: Fixture, precision: Precision, case: str, tap: str) -> str | None:
        """The node where the divergence at `tap` starts (localize.py), one line; None when it cannot be told."""
        from parity_harness._backends.onnx.localize import locate

        found = self.sources(fixture)
        if tap not in found:
            return None
        place = fixture.tap_names.index(tap)
        stops = {found[t].tensor for t in fixture.tap_names[:place] if t in found}
        stops.discard(found[tap].tensor)
        tokens = list(fixture.case(case).tokens)
        session, names, _ = self._session()
        values = self._run_all(session, names, tokens, case)
        reference, reference_node = _reference_values(fixture, tokens, tap)
        where = locate(self.model(), values, found[tap].tensor, stops, reference, reference_node)
        if where is None:
            return None
        note = "" if reference else " (the fixture has no ONNX graph of its own: only the kernels were checked)"
        return f"in the graph, {where.line()}{note}"

    def build_info(self) -> str | None:
        return f"{self.path.name}: {self._weights_note}" if self._weights_note else None

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        found = self.sources(fixture)
        session, names, _ = self._session()
        out: BackendOutput = {}
        config = fixture.model.config  # the family's config (GPTConfig, LlamaConfig)
        for case in fixture.cases:
            checked_tokens(f"case {case.name!r}", case.tokens, config.vocab_size, config.n_ctx,
                           "the graph's Gather would fail or read past its embedding table")
            values = self._run_all(session, names, list(case.tokens), case.name)
            taps: dict[str, np.ndarray] = {}
            for tap, source in found.items():
                read = as_tap(values[source.tensor], tuple(fixture.tap_shape(tap, case)), source.permutation,
                              source.drop)
                if read is None:
                    raise BackendFailed(f"{self.path}: case {case.name!r}: tensor {source.tensor!r} "
                                        f"{values[source.tensor].shape} cannot be read as {tap}")
                taps[tap] = np.ascontiguousarray(read_mask(tap, read), dtype=np.float32)
            out[case.name] = taps
        return out


def _reference_values(fixture: Fixture, tokens: list[int], tap: str) -> tuple[dict[str, np.ndarray], str]:
    """Every float tensor of the fixture's own all-taps graph on `tokens` (its export, the model as written), and the
    node that computes `tap` there; ({}, "") when the fixture has no graph."""
    from parity_harness._backends.onnx.load import load_onnx
    from parity_harness._backends.onnx.localize import run_exposed

    path = fixture.onnx_path("all_taps") or fixture.onnx_path("logits")
    if path is None or not path.is_file():
        return {}, ""
    model = load_onnx(path)
    out = run_exposed(model, {model.graph.input[0].name: np.asarray(tokens, dtype=np.int64)})
    node, op = producers(model).get(tap, ("", ""))
    return {k: v for k, v in out.items() if v.dtype.kind == "f"}, (f"{op} {node}" if node else "")


def _weights_held(model: Any, fixture: Fixture) -> str:
    """How many of the fixture's weight tensors the graph holds as initializers, bit for bit (in any layout)."""
    from onnx import numpy_helper

    held = {np.asarray(numpy_helper.to_array(t), dtype=np.float32).tobytes() for t in model.graph.initializer}
    held |= {np.ascontiguousarray(np.asarray(numpy_helper.to_array(t), dtype=np.float32).T).tobytes()
             for t in model.graph.initializer if len(t.dims) == 2}
    weights = fixture.weights()
    missing = [name for name, w in weights.items() if np.ascontiguousarray(w).tobytes() not in held]
    if not missing:
        return f"holds every one of the fixture's {len(weights)} weight tensors"
    # An exporter folds a constant tensor (a bias of zeros) into its node, or shares one initializer among equal
    # ones: such a tensor is not evidence of other weights (nor checked).
    constant = [name for name in missing if np.ptp(weights[name]) == 0]
    if len(constant) == len(missing):
        values = sorted({float(weights[name].flat[0]) for name in constant})
        return (f"holds every one of the fixture's {len(weights) - len(constant)} non-constant weight tensors; "
                f"its {len(constant)} constant ones (all {', '.join(f'{v:g}' for v in values)}) are not stored as "
                "such (an exporter folds them)")
    return (f"holds {len(weights) - len(missing)} of the fixture's {len(weights)} weight tensors bit for bit: its "
            f"weights differ, {missing[0]} the first (compared all the same)")


def _first(exc: BaseException) -> str:
    from parity_harness._backends.onnx.load import first_line

    return first_line(exc)
