"""The first divergence down to the op for a PyTorch model: the aten ops between the last agreeing taps and the
first diverging one, recorded without changing the model (a TorchDispatchMode around its forward).

The model's forward runs once for the case with every aten op recorded (its function, inputs and outputs), and
once more the family's own reference (`parity_reference.model` or `llama_model`), also recorded. Walking back
from the diverging tap's tensor through the recorded ops, stopping at the agreeing taps' tensors and the
parameters, gives the ops inside the tap; in order, each is checked as localize.py checks a graph's nodes:

- its output against its own float64 recomputation (the same aten op on the same inputs in float64): a kernel
  that breaks;
- else whether the reference's forward computes that output anywhere (any layout, within float32's rounding):
  the first op it does not is where the model departs from the reference, named with its inputs and the Python
  numbers among them (the eps an add adds);
- when every op agrees, the model lacks an op the reference has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from parity_harness._backends.onnx.match import _best, distance

C_OP = 64.0  # an op's float32 output may be this many eps32 * M off its float64 recomputation
EPS32 = 2.0**-23
PASS_THROUGH = ("clone", "contiguous", "detach", "alias", "_to_copy", "lift_fresh")  # copies: not an op of the model


@dataclasses.dataclass
class Op:
    """One recorded aten op: the function, its arguments, its tensor outputs."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[Any]

    @property
    def name(self) -> str:
        return str(getattr(self.func, "__name__", self.func))


def record(run: Callable[[], Mapping[str, Any]]) -> tuple[list[Op], dict[str, Any]]:
    """Every aten op `run()` dispatches, in order, and what it returned ({tap: tensor})."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[Op] = []

    class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
            ops.append(Op(func, args, dict(kwargs or {}), outs))
            return out

    with torch.no_grad(), Recorder():  # type: ignore[no-untyped-call]
        taps = dict(run())
    return ops, taps


def _tensors(values: Any) -> list[Any]:
    import torch

    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, (tuple, list)):
        return [t for v in values for t in _tensors(v)]
    return []


def _source(tensor: Any, made_by: Mapping[int, Op]) -> Any:
    """The tensor a tap's copy was made from (a tap is recorded as a contiguous copy of the model's tensor)."""
    while id(tensor) in made_by and made_by[id(tensor)].name.split(".")[0] in PASS_THROUGH:
        inputs = _tensors(made_by[id(tensor)].args)
        if not inputs:
            break
        tensor = inputs[0]
    return tensor


def _describe(op: Op) -> str:
    parts = []
    for arg in op.args:
        tensors = _tensors(arg)
        if tensors:
            parts += [f"[{', '.join(str(n) for n in t.shape)}]" for t in tensors]
        elif isinstance(arg, float | int) and not isinstance(arg, bool):
            parts.append(f"{arg:g}")
    return f"{op.name}({', '.join(parts)})"


def _float64(op: Op) -> Any:
    import torch

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(torch.float64)
        if isinstance(x, (tuple, list)):
            return type(x)(up(v) for v in x)
        return x

    kwargs = {k: (torch.float64 if k == "dtype" and v in (torch.float32,) else up(v)) for k, v in op.kwargs.items()}
    try:
        out = op.func(*up(op.args), **kwargs)
    except Exception:  # an op with float32-only arguments: no verdict from it
        return None
    return _tensors(out)


def locate(ops: Sequence[Op], taps: Mapping[str, Any], reference_ops: Sequence[Op] | None, order: Sequence[str],
           tap: str) -> str | None:
    """Where inside `tap` its divergence starts (module docstring), one line; None when no op lies between, or,
    without `reference_ops` (the model is the reference), when every op's kernel agrees."""
    made_by = {id(o): op for op in ops for o in op.outputs}
    place = list(order).index(tap)
    stops = {id(_source(taps[t], made_by)) for t in order[:place] if t in taps}
    target = _source(taps[tap], made_by)
    region: set[int] = set()
    todo, seen = [target], set()
    while todo:
        tensor = todo.pop()
        if id(tensor) in seen or id(tensor) in stops or id(tensor) not in made_by:
            continue
        seen.add(id(tensor))
        op = made_by[id(tensor)]
        region.add(id(op))
        todo.extend(_tensors(op.args))
    inside = [op for op in ops if id(op) in region]
    if not inside:
        return None
    reference = {str(k): o.detach().numpy() for k, op in enumerate(reference_ops or [])
                 for o in op.outputs[:1] if o.is_floating_point() and o.numel()}
    names = list(reference)
    for op in inside:
        out = op.outputs[0] if op.outputs else None
        if out is None or not out.is_floating_point() or not out.numel():
            continue
        got = out.detach().numpy().astype(np.float64)
        magnitude = float(np.max(np.abs(got[np.isfinite(got)]), initial=0.0))
        exact = _float64(op)
        if exact and exact[0].shape == out.shape:
            off = distance(got, exact[0].numpy())
            if off > C_OP * EPS32 * max(magnitude, 1e-30):
                return f"aten op {_describe(op)} computes {off:.2g} off its float64 recomputation: the kernel"
        if reference_ops is None:
            continue  # the model is the reference: its kernels alone are checked
        best = _best(reference, names, got)
        nearest = best[0][0] if best is not None else float("inf")
        if not nearest <= C_OP * EPS32 * max(magnitude, 1e-30) + 1e-7:
            return (f"aten op {_describe(op)} is the first whose output the reference's forward computes nowhere "
                    f"(nearest {nearest:.2g} away): the model departs from the reference there")
    if reference_ops is None:
        return None
    return f"every aten op up to {_describe(inside[-1])} agrees with the reference: the model lacks one it has"


def locate_in_forward(run: Callable[[], Mapping[str, Any]], reference: Callable[[], Mapping[str, Any]] | None,
                      order: Sequence[str], tap: str) -> str | None:
    """`locate` for a forward (`run`, e.g. a patched copy of model.run_with_taps on the case) against the family's
    reference forward on the same case (None: `run` is the reference; its kernels alone are checked)."""
    ops, taps = record(run)
    if tap not in taps:
        return None
    reference_ops = record(reference)[0] if reference is not None else None
    where = locate(ops, taps, reference_ops, order, tap)
    return f"in the forward, {where}" if where else None
