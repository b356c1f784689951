"""Render the gradient check (`parity run --grad`, parity_harness/_run/grad_check.py): lines, paragraphs, JSON.

One line per backend x tier for the backward and one for the training steps, always shown (a run asked for
them); the first divergence of each as a paragraph that reads the backward in its own order: the first
diverging gradient is the one nearest the loss, and every gradient before it in that order agrees. Outside
strings (backend names) are printed as they are, through the console's one sanitizing sink.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from parity_harness._compare.judge import NOT_SUPPORTED, FirstDivergence
from parity_harness._core.text import format_pair, num_text, tier_label, tolerance_text
from parity_reference.training import GRAD_SUFFIX

if TYPE_CHECKING:
    from parity_harness._compare.gradients import GradReport
    from parity_harness._compare.tree import GradNode, TierNode


def _share(tier: TierNode) -> str:
    worst = tier.worst
    if worst is None:
        return "nothing compared"
    if tier.n_failed:
        first = tier.divergence.tap if tier.divergence is not None else "?"
        return f"FAIL  {tier.n_failed} of {tier.n_compared} failing, first {first}"
    return f"ok    worst {worst.used:.0%} of tolerance ({worst.tap})"


def grad_lines(node: GradNode) -> list[str]:
    """The gradient section: what was checked, one line per backend x tier (backward, then training), and who
    has no backward."""
    grad = node.source
    if not grad.available:
        return ["gradients: not checked: the fixture has no gradient goldens (no 'training' section in its manifest)"]
    spec = grad.spec
    lines = [f"gradients: {len(grad.cases)} cases, {len(grad.names)} records each (the loss, {len(grad.names) - 1} "
             "gradients nearest the loss first); "
             f"training: {grad.steps} AdamW steps" + (f", lr {', '.join(f'{x:g}' for x in spec.lr)}, weight decay "
                                                      f"{spec.weight_decay:g}" if spec is not None else "")]
    names = max((len(t.backend) for t in (*node.tiers, *node.train_tiers)), default=7)
    for kind, tiers in (("backward", node.tiers), ("training", node.train_tiers)):
        for tier in tiers:
            label = tier_label(tier.precision, tier.golden)
            compared = f"{tier.n_compared}/{len(tier.taps)}"
            lines.append(f"{tier.backend:<{names}}  {kind:<8}  {label:<12}  {compared:>7}  {_share(tier)}")
    if not node.tiers:
        lines.append("gradients: no backend run has a backward")
    budget = (f"; {grad.n_budgeted} names at their measured budget x 4 (the manifest's training.units)"
              if grad.n_budgeted else "")
    lines.append("gradient tolerances: atol c x eps x M, M the largest float64 gradient up to it in backward order: "
                 + ", ".join(f"{t} c {c:g}" for t, c in grad.c.items()) + budget)
    if grad.not_supported:
        lines.append(f"backward not supported by: {', '.join(grad.not_supported)}")
    if grad.not_training:
        lines.append(f"training step not supported by: {', '.join(grad.not_training)}")
    return lines


def _values(d: FirstDivergence) -> str:
    if d.message:
        return f": {d.message}"
    if d.actual is None or d.expected is None:
        return ""
    got, want = format_pair(d.actual, d.expected)
    return f": got {got}, expected {want} (|diff| {num_text(d.max_abs)} > {tolerance_text(d.atol, d.rtol)})"


def divergence_paragraph(d: FirstDivergence, grad: GradReport) -> str:
    """e.g. "numpy fp32 vs fp32 backward: first divergence at blocks.1.hook_resid_mid.grad ... The backward from
    blocks.1.ln2.hook_scale to blocks.1.hook_resid_mid broke: the 12 records nearer the loss agree ..."."""
    where = f", {d.location}" if d.location else f" at {d.index}" if d.index else ""
    agree = "exactly" if d.upstream_max_abs == 0 else f"within {num_text(d.upstream_max_abs)}"
    tier = tier_label(d.precision, d.golden)
    cause = f" Likely cause: {d.cause}." if d.cause else ""
    if d.step is not None:  # the training step
        before = ("It is the first record of step 1." if d.upstream_taps == 0 else
                  f"Every record before it (the earlier steps, and this step's loss, gradient norm and parameters "
                  f"before it) agrees ({agree}).")
        return (f"{d.backend} training {tier}: first divergence at step {d.step}, {d.tap}{where}{_values(d)}. "
                f"{before}{cause}")
    base = d.tap.removesuffix(GRAD_SUFFIX)
    if d.tap == "loss":
        what = "the case's loss itself differs: the forward pass or the cross-entropy, not the backward."
    elif d.previous_tap is None or d.previous_tap == "loss":
        what = f"the gradient of {base}, the first after the loss: the cross-entropy's backward broke."
    elif base in grad.param_names:
        what = (f"the gradient of the parameter {base}: every tap's gradient agrees, so the step that accumulates "
                "this parameter's gradient broke.")
    else:
        nearer = d.previous_tap.removesuffix(GRAD_SUFFIX)
        what = (f"the gradient of {base}: the backward from {nearer} to {base} broke, and the {d.upstream_taps} "
                f"records nearer the loss agree ({agree}).")
    return (f"{d.backend} backward {tier}: first divergence at {d.tap}, case {d.case}{where}{_values(d)}. This is "
            f"{what}{cause}")


def grad_verdict(grad: GradReport | None) -> str:
    """'' when the gradient check passed (or was not asked); else what the verdict line says about it."""
    if grad is None or not grad.n_failed:
        return ""
    firsts = [*grad.divergences, *grad.train_divergences]
    if not firsts:
        return f"gradients: {grad.n_failed} failed"
    d = firsts[0]
    where = f"step {d.step}, {d.tap}" if d.step is not None else d.tap
    kind = "training" if d.step is not None else "backward"
    return f"{kind}: first divergence at {where} ({d.backend} {tier_label(d.precision, d.golden)})"


def grad_counts(grad: GradReport) -> str:
    n_ns = sum(1 for r in (*grad.checks, *grad.train_checks) if r.status == NOT_SUPPORTED)
    return f"{grad.n_passed} passed, {grad.n_failed} failed, {n_ns} not supported (gradient and training checks)"


def grad_json(grad: GradReport) -> dict[str, Any]:
    """The JSON report's `grad`: what was checked, every check, per-name summaries and the first divergences."""
    return {
        "available": grad.available,
        "cases": list(grad.cases),
        "names": list(grad.names),
        "steps": grad.steps,
        "train_names": list(grad.train_names),
        "spec": grad.spec.to_dict() if grad.spec is not None else None,
        "passed": grad.n_failed == 0 and grad.n_passed > 0,
        "counts": {"passed": grad.n_passed, "failed": grad.n_failed},
        "results": [asdict(r) for r in grad.checks],
        "train_results": [asdict(r) for r in grad.train_checks],
        "summaries": [asdict(s) for s in grad.summaries],
        "train_summaries": [asdict(s) for s in grad.train_summaries],
        "first_divergence": [asdict(d) for d in grad.divergences],
        "train_first_divergence": [asdict(d) for d in grad.train_divergences],
        "runs": [asdict(r) for r in grad.runs],
        "not_supported": list(grad.not_supported),
        "not_training": list(grad.not_training),
    }


__all__ = ["divergence_paragraph", "grad_counts", "grad_json", "grad_lines", "grad_verdict"]
