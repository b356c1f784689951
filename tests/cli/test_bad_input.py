"""Bad input, table-driven: each broken fixture or argument exits 2 with one line naming the problem.

Every case starts from a copy of the committed fixture, breaks one thing, and runs `parity run`
in a subprocess as a user would: exit code 2, exactly one `parity: error:` line on stderr that
contains the expected words, no traceback, and never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers import TOY, assert_one_line_error, rehash, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

Breaker = Callable[[Path], object]  # its return value, if any, is ignored


def manifest_edit(change: Callable[[dict], None], rehash_files: bool = False) -> Breaker:  # type: ignore[type-arg]
    def breaker(root: Path) -> None:
        m = json.loads((root / "manifest.json").read_text())
        change(m)
        (root / "manifest.json").write_text(json.dumps(m))
        if rehash_files:
            rehash(root)
    return breaker


def tensors_edit(file: str, change: Callable[[dict[str, np.ndarray]], object]) -> Breaker:
    def breaker(root: Path) -> None:
        tensors = {k: v.copy() for k, v in load_file(str(root / file)).items()}
        change(tensors)
        save_file(tensors, str(root / file))
        rehash(root)
    return breaker


def bytes_edit(file: str, change: Callable[[bytes], bytes]) -> Breaker:
    def breaker(root: Path) -> None:
        (root / file).write_bytes(change((root / file).read_bytes()))
        rehash(root)
    return breaker


def set_case(field: str, value: object) -> Breaker:
    return manifest_edit(lambda m: m["cases"][0].__setitem__(field, value))


def _first_golden_key(tensors: dict[str, np.ndarray], tap: str) -> str:
    return next(k for k in sorted(tensors) if k.endswith("/" + tap))


def _set_nan(t: dict[str, np.ndarray], key: str) -> None:
    t[key][(0,) * t[key].ndim] = np.nan


W = "weights.safetensors"
G32 = "golden.fp32.safetensors"
G64 = "golden.fp64.safetensors"
WTE = "wte.weight"

CASES: list[tuple[str, Breaker, tuple[str, ...]]] = [
    ("weights truncated", bytes_edit(W, lambda b: b[: len(b) // 2]), (W, "not a readable safetensors")),
    ("weights header garbage", bytes_edit(W, lambda b: b"\xff" * 8 + b[8:]), (W, "not a readable safetensors")),
    ("weights empty file", bytes_edit(W, lambda b: b""), (W, "not a readable safetensors")),
    ("weights float64", tensors_edit(W, lambda t: t.__setitem__(WTE, t[WTE].astype(np.float64))),
     (W, WTE, "expected float32")),
    ("weights wrong shape", tensors_edit(W, lambda t: t.__setitem__(WTE, t[WTE][:5])), (W, WTE, "has shape")),
    ("weights NaN", tensors_edit(W, lambda t: _set_nan(t, "ln_f.bias")), (W, "ln_f.bias", "non-finite")),
    ("weights Inf", tensors_edit(W, lambda t: t["h.0.ln_1.weight"].__setitem__(0, np.inf)),
     ("h.0.ln_1.weight", "non-finite")),
    ("weights missing tensor", tensors_edit(W, lambda t: t.pop("h.1.mlp.c_proj.bias")),
     ("missing tensor", "h.1.mlp.c_proj.bias")),
    ("weights extra tensor", tensors_edit(W, lambda t: t.__setitem__("lm_head.weight", t[WTE] * 2)),
     ("unexpected tensor", "lm_head.weight")),
    ("manifest not JSON", lambda r: (r / "manifest.json").write_text("{"), ("manifest.json", "not valid JSON")),
    ("manifest a list", lambda r: (r / "manifest.json").write_text("[]"), ("manifest.json", "JSON object")),
    ("unknown format version", manifest_edit(lambda m: m.update(format_version=2)),
     ("unknown fixture format version 2",)),
    ("not a parity fixture", manifest_edit(lambda m: m.update(format="other")), ("not a parity fixture",)),
    ("hash mismatch", lambda r: (r / G32).write_bytes((r / G32).read_bytes() + b"x"), (G32, "sha256 mismatch")),
    ("file outside the fixture", manifest_edit(lambda m: m["files"].update(weights="../weights.safetensors")),
     ("../weights.safetensors", "plain name")),
    ("listed file missing", lambda r: (r / G64).unlink(), (G64, "file not found")),
    ("token id out of range", set_case("tokens", [1, 2, 12]), ("token id 12 out of range",)),
    ("negative token id", set_case("tokens", [-1]), ("cases[0].tokens[0]: -1 must be >= 0",)),
    ("token id not an integer", set_case("tokens", [1.5]), ("cases[0].tokens[0]: 1.5 must be of type integer",)),
    ("empty sequence", set_case("tokens", []), ("cases[0].tokens: [] must not be empty",)),
    ("sequence longer than the context", set_case("tokens", [1] * 17), ("17 tokens", "context (16)")),
    ("duplicate case name", manifest_edit(lambda m: m["cases"].append(dict(m["cases"][0]))), ("repeated",)),
    ("config key missing", manifest_edit(lambda m: m["config"].pop("n_head")), ("config: missing key 'n_head'",)),
    ("config inconsistent", manifest_edit(lambda m: m["config"].update(n_head=3)), ("not divisible",)),
    ("vocab wrong length", manifest_edit(lambda m: m["vocab"].pop()), ("vocab must be 12 strings",)),
    ("tap missing from manifest", manifest_edit(lambda m: m["taps"].pop(5)), ("taps do not match", "missing")),
    ("tap shape wrong", manifest_edit(lambda m: m["taps"][0].update(shape=["T", 9])), ("hook_embed", "shape")),
    ("negative tolerance", manifest_edit(lambda m: m["tolerances"]["fp32"].update(atol=-1.0)),
     ("tolerances.fp32.atol: -1.0 must be >= 0",)),
    ("tolerance for an unknown tap", manifest_edit(lambda m: m["tolerances"]["fp64"]["overrides"].update(
        {"blocks.9.hook_q": {"atol": 1.0, "rtol": 0.0}})), ("unknown tap", "blocks.9.hook_q")),
    ("golden missing a tap", tensors_edit(G32, lambda t: t.pop(_first_golden_key(t, "probs"))),
     (G32, "missing golden tensor", "/probs")),
    ("golden wrong dtype", tensors_edit(G64, lambda t: t.__setitem__(
        _first_golden_key(t, "logits"), t[_first_golden_key(t, "logits")].astype(np.float32))), (G64, "float32")),
    ("golden wrong shape", tensors_edit(G32, lambda t: t.__setitem__(
        _first_golden_key(t, "logits"), t[_first_golden_key(t, "logits")][:, :3])), (G32, "has shape")),
    ("golden holds NaN", tensors_edit(G32, lambda t: _set_nan(t, _first_golden_key(t, "hook_embed"))),
     (G32, "holds NaN")),
    ("golden extra tensor", tensors_edit(G32, lambda t: t.__setitem__("ghost/logits", np.zeros(1, np.float32))),
     (G32, "unexpected golden tensor", "ghost/logits")),
]


@pytest.mark.parametrize(("name", "breaker", "needles"), CASES, ids=[c[0] for c in CASES])
def test_bad_fixture_exits_2_with_one_line(
    fixture_copy: Path, name: str, breaker: Breaker, needles: tuple[str, ...]
) -> None:
    breaker(fixture_copy)
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "pytorch", "-q")
    assert_one_line_error(proc, *needles)
    assert "PASS" not in proc.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("run", "--backends", "nope"), ("unknown backend 'nope'",)),
        (("run", "--backends", ","), ("--backends needs at least one backend name",)),
        (("check-backend", "nope"), ("unknown backend 'nope'",)),
        (("check-backend", "onnx-file"), ("check-backend onnx-file: it declines the fixture: no graph was given",
                                         "--onnx FILE")),
        (("check-backend", "numpy", "--onnx", str(TOY / "model.logits.onnx")),
         ("--onnx: a graph is checked by the 'onnx-file' backend, not 'numpy'",)),
        (("check-backend", "onnx-file", "--onnx", "no-such.onnx"), ("no-such.onnx: no such ONNX file (--onnx)",)),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    assert_one_line_error(run_cli(*args), *needles)


def test_the_table_is_at_least_25_cases() -> None:
    assert len(CASES) >= 25
