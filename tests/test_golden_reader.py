"""A large golden file, read lazily (`Fixture.validate_golden`, `golden_case`, `golden_tap`): the same numbers as the
golden held in memory, read-only for good, and a corrupted or changed file refused with one line naming it; each
golden's magnitudes measured once (`golden_magnitudes`), as `tap_magnitude` defines them.

The toy's goldens are small enough to be held in memory; setting LAZY_GOLDEN_BYTES to -1 sends them down the path a
GPT-2-sized fixture takes (`TensorFile`: the header checked by parity itself, each tensor read into immutable bytes).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._compare.budget import BudgetAccumulator, tap_budget
from parity_harness._compare.diagnose import PREVIOUS_TAP
from parity_harness._core.errors import FixtureError
from parity_harness._fixture import fixture as fixture_module
from parity_harness._fixture.files import open_tensor_file
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.tolerances import tap_magnitude
from parity_harness._run.runner import CaseJudge
from tests.conftest import rehash

G32 = "golden.fp32.safetensors"


def lazy(root: Path, monkeypatch: pytest.MonkeyPatch) -> Fixture:
    """The fixture at `root` with both golden files checked and read as a GPT-2-sized fixture's are."""
    monkeypatch.setattr(fixture_module, "LAZY_GOLDEN_BYTES", -1)  # an empty file too
    fx = load_fixture(root)
    fx.check_before_running()
    assert not fx._golden and set(fx._golden_files) == {"fp32", "fp64"}  # nothing held in memory
    return fx


def test_a_lazily_read_golden_equals_the_golden_held_in_memory(toy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = load_fixture(toy_dir)
    held.check_before_running()
    assert set(held._golden) == {"fp32", "fp64"}
    read = lazy(toy_dir, monkeypatch)
    for precision in ("fp32", "fp64"):
        for case in held.cases:
            want, got = held.golden_case(precision, case.name), read.golden_case(precision, case.name)  # type: ignore[arg-type]
            assert list(got) == list(want) == held.tap_names
            for tap, a in got.items():
                assert a.dtype == want[tap].dtype and a.shape == want[tap].shape, (precision, case.name, tap)
                assert a.tobytes() == want[tap].tobytes(), (precision, case.name, tap)
                assert read.golden_tap(precision, case.name, tap).tobytes() == a.tobytes()  # type: ignore[arg-type]
            magnitudes = read.golden_magnitudes(precision, case.name)  # type: ignore[arg-type]
            assert magnitudes == held.golden_magnitudes(precision, case.name)  # type: ignore[arg-type]
            assert magnitudes == {tap: tap_magnitude([a]) for tap, a in want.items()}
    assert read.tap_magnitudes() == held.tap_magnitudes()


@pytest.mark.parametrize("how", ["lazy", "held"])
def test_golden_arrays_cannot_be_made_writeable(toy_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "lazy":
        fx = lazy(toy_dir, monkeypatch)
    else:
        fx = load_fixture(toy_dir)
        fx.check_before_running()
        assert set(fx._golden) == {"fp32", "fp64"} and not fx._golden_files
    case = fx.cases[0].name
    clone = fx.for_backend()  # what a backend is handed
    arrays = [*fx.golden_case("fp64", case).values(), fx.golden_tap("fp32", case, "logits"),
              *clone.golden_case("fp32", case).values()]
    for a in arrays:
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            a.flags.writeable = True
        with pytest.raises(ValueError, match="read-only"):
            a += 1
    logits = fx.golden_case("fp64", case)["logits"]
    view = logits.view()  # a view of it is no way around either
    with pytest.raises(ValueError, match="WRITEABLE"):
        view.flags.writeable = True
    assert fx.golden_case("fp64", case)["logits"].tobytes() == logits.tobytes()


def test_a_backend_copy_keeps_its_own_magnitudes(toy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fx = lazy(toy_dir, monkeypatch)
    case = fx.cases[0].name
    before, tap_before = fx.golden_magnitudes("fp64", case), fx.tap_magnitudes()
    clone = fx.for_backend()
    clone._case_magnitudes[("fp64", case)]["logits"] = 1e30  # a backend poking at its copy
    assert clone._magnitudes is not None
    clone._magnitudes["logits"] = 1e30  # what the reduced precisions' atol is made of
    clone._golden_files.clear()
    assert fx.golden_magnitudes("fp64", case) == before and fx.tap_magnitudes() == tap_before
    assert fx.golden_case("fp64", case)["logits"].shape


@pytest.mark.parametrize("how", ["lazy", "held"])
def test_a_backend_declaring_few_taps_is_judged_and_diagnosed_as_before(
    toy_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """Only the goldens of its declared taps are read; the diagnosis still reads the tap before the first
    failing one when the backend does not declare it (here: hook_pos_embed returning hook_embed's values)."""
    if how == "lazy":
        fx = lazy(toy_dir, monkeypatch)
    else:
        fx = load_fixture(toy_dir)
        fx.check_before_running()
    case = fx.cases[0]
    assert list(fx.golden_case("fp32", case.name, {"logits", "hook_embed"})) == ["hook_embed", "logits"]
    embed = np.array(fx.golden_case("fp64", case.name)["hook_embed"])
    judge = CaseJudge(fx, "b", "fp64", ["hook_pos_embed", "logits"])
    judge.add(case, {"hook_pos_embed": embed, "logits": np.array(fx.golden_tap("fp64", case.name, "logits"))})
    failing = {(r.golden, r.tap) for results in judge.by_tier.values() for r in results if r.status == "fail"}
    assert failing == {("fp32", "hook_pos_embed"), ("fp64", "hook_pos_embed")}
    assert {k: PREVIOUS_TAP in v for k, v in judge.causes.items()} == {
        ("fp32", case.name, "hook_pos_embed"): True, ("fp64", case.name, "hook_pos_embed"): True}


# --- A corrupted file: one line naming the file and, where there is one, the tensor --------------------------


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path: Path, header: dict[str, Any] | bytes, data: bytes) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def _key(header: dict[str, Any], tap: str) -> str:
    return next(k for k in sorted(header) if k.endswith("/" + tap))


def header_edit(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], str]:
    """A breaker: the header changed by `change`, which returns the tensor it broke (or "" for none)."""
    def breaker(path: Path) -> str:
        header, data = _header(path)
        name = change(header)
        _write(path, header, data)
        return str(name or "")
    return breaker


def _relabel(field: str, value: Callable[[Any], Any], tap: str = "logits") -> Callable[[Path], str]:
    def change(header: dict[str, Any]) -> str:
        key = _key(header, tap)
        header[key][field] = value(header[key][field])
        return key
    return header_edit(change)


def _overlap(header: dict[str, Any]) -> str:
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [0, end - begin]  # on top of the first tensor, and a gap at the end
    return ""


def _nan(path: Path) -> str:
    header, data = _header(path)
    key = _key(header, "hook_embed")
    begin = header[key]["data_offsets"][0]
    _write(path, header, data[:begin] + np.float32(np.nan).tobytes() + data[begin + 4:])
    return key


def _truncate(path: Path) -> str:
    header, data = _header(path)
    _write(path, header, data[:-4])
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])


def _bytes(change: Callable[[bytes], bytes]) -> Callable[[Path], str]:
    def breaker(path: Path) -> str:
        path.write_bytes(change(path.read_bytes()))
        return ""
    return breaker


def _repeat_key(path: Path) -> str:
    header, data = _header(path)
    key = _key(header, "logits")
    text = json.dumps(header).encode()
    entry = json.dumps({key: header[key]})[1:-1].encode()
    _write(path, text[:-1] + b", " + entry + b"}", data)
    return ""


CORRUPTIONS: list[tuple[str, Callable[[Path], str], str]] = [
    ("dtype relabelled", _relabel("dtype", lambda _d: "I32"), "is int32, expected float32"),
    ("dtype unknown", _relabel("dtype", lambda _d: "F33"), "unknown dtype 'F33'"),
    ("shape relabelled", _relabel("shape", lambda s: s[::-1], "blocks.0.attn.hook_k"), "has shape"),
    ("shape of another size", _relabel("shape", lambda s: [*s[:-1], s[-1] + 1]), "bytes, its dtype and shape"),
    ("shape not integers", _relabel("shape", lambda s: [float(d) for d in s]), "not a list of non-negative integers"),
    ("offsets past the end", _relabel("data_offsets", lambda o: [o[0] + 10**9, o[1] + 10**9]), "past the end"),
    ("offsets reversed", _relabel("data_offsets", lambda o: o[::-1]), "0 <= begin <= end"),
    ("offsets overlapping", header_edit(_overlap), "gap or an overlap"),
    ("truncated", _truncate, "past the end of the file"),
    ("trailing bytes", _bytes(lambda b: b + bytes(8)), "8 bytes after the last tensor"),
    ("header length past the end", _bytes(lambda b: (len(b) * 2).to_bytes(8, "little") + b[8:]), "a header of"),
    ("header not JSON", _bytes(lambda b: b[:8] + b"\xff" + b[9:]), "not JSON"),
    ("header repeats a key", _repeat_key, "duplicate key"),
    ("empty file", _bytes(lambda _b: b""), "shorter than its 8-byte header length"),
    ("NaN", _nan, "holds NaN"),
]


@pytest.mark.parametrize(("name", "breaker", "needle"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupted_golden_file_is_refused_naming_the_file_and_tensor(
    fixture_copy: Path, monkeypatch: pytest.MonkeyPatch, name: str, breaker: Callable[[Path], str], needle: str,
) -> None:
    tensor = breaker(fixture_copy / G32)
    rehash(fixture_copy)  # as a fixture sealed with its corruption would be: the hash does not save the day
    with pytest.raises(FixtureError) as caught:
        lazy(fixture_copy, monkeypatch)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(fixture_copy / G32)), message
    assert needle in message, message
    if tensor:
        assert repr(tensor) in message, message


def test_the_reader_accepts_what_safetensors_writes(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {
        "a": np.arange(6, dtype=np.float64).reshape(2, 3), "b": np.zeros((0, 4), np.float32),
        "c": np.array([1.5], np.float32), "d": np.arange(4, dtype=np.int64)}
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "np"})
    f = open_tensor_file(tmp_path / "t.safetensors")
    assert set(f.tensors) == set(tensors)
    with f.reading() as read:
        for name, want in tensors.items():
            got = read(name)
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
            assert not got.flags.writeable


def test_a_golden_file_changed_after_its_check_is_refused(fixture_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fx = lazy(fixture_copy, monkeypatch)
    case = fx.cases[0].name
    fx.golden_case("fp32", case)
    path = fixture_copy / G32
    replacement = fixture_copy / "replacement"
    shutil.copyfile(path, replacement)
    os.replace(replacement, path)  # the same bytes, another file: what was checked is not what would be read
    for read in (lambda: fx.golden_case("fp32", case), lambda: fx.golden_tap("fp32", case, "logits")):
        with pytest.raises(FixtureError, match="changed since it was checked") as caught:
            read()
        assert str(caught.value).startswith(str(path))
    fx.golden_case("fp64", case)  # the other tier's file did not change


# --- Magnitudes, measured once ---------------------------------------------------------------------------------


def _magnitude_by_definition(g: np.ndarray) -> float:
    finite = g[np.isfinite(g)]
    return float(np.abs(finite).max()) if finite.size else 0.0


def test_tap_magnitude_is_the_largest_finite_abs_value() -> None:
    rng = np.random.default_rng(5)
    arrays: list[np.ndarray] = [np.zeros(0), np.array([-0.0]), np.array([-0.0, 0.0], np.float32), np.array(3.5),
                                np.array([np.nan, 2.0]), np.array([np.nan]), np.array([-np.inf, 1.0, -3.0]),
                                np.array([np.inf, np.nan]), np.array([-7, 3], np.int64), np.array([1e300, -1e308]),
                                np.array([-65504.0, 1.0], np.float16), np.array([5e-324, -0.0])]
    for _ in range(200):
        g = rng.standard_normal(int(rng.integers(1, 50))) * 10.0 ** rng.uniform(-30, 30)
        g[rng.integers(g.size, size=int(rng.integers(0, 3)))] = rng.choice([np.inf, -np.inf, np.nan, -0.0, 0.0])
        arrays.append(g.astype(np.float32 if rng.random() < 0.5 else np.float64))
    for g in arrays:
        want = max(0.0, _magnitude_by_definition(g))
        got = tap_magnitude([g])
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), (g, got, want)
    assert tap_magnitude(arrays) == max(tap_magnitude([g]) for g in arrays)


def test_the_budget_reads_the_magnitudes_measured_once(toy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A magnitude handed to the budget (`Fixture.golden_magnitudes`) gives the rows it measures itself."""
    fx = lazy(toy_dir, monkeypatch)
    own, handed = (BudgetAccumulator("x", "fp32", fx.tap_names, fx.tap_names) for _ in range(2))
    for case in fx.cases:
        output, truth = fx.golden_case("fp32", case.name), fx.golden_case("fp64", case.name)
        own.add_case(case.name, output, truth)
        handed.add_case(case.name, output, truth, fx.golden_magnitudes("fp64", case.name))
    assert own.rows() == handed.rows() and any(r.max_abs for r in own.rows())
    logits = fx.golden_case("fp64", fx.cases[0].name)["logits"]
    row = tap_budget("x", "fp32", "logits", {"c": logits}, {"c": logits}, magnitude=123.0)
    assert row.magnitude == 123.0 and row.max_abs == 0.0  # what it is handed is what it reports
