"""The conformance kit: the NumPy backend passes every check, and each kind of broken backend fails
the check meant for it (and only that one), with a message that says what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from parity_harness._backends.base import BackendOutput, Precision
from parity_harness._backends.numpy_backend import NumpyBackend as _NumpyBackend
from parity_harness._core.precision import DTYPES
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.conformance import ConformanceResult, check_backend
from tests.helpers import build_random_fixture

REPO = Path(__file__).resolve().parents[3]


class NumpyBackend(_NumpyBackend):
    """The broken backends below break numpy's fp32 and fp64 (its fp16 would only add rows to count)."""

    precisions = ("fp32", "fp64")


@pytest.fixture(scope="session")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return load_fixture(build_random_fixture(tmp_path_factory.mktemp("conformance_fixture")))


def failed(results: list[ConformanceResult]) -> dict[str, str]:
    return {r.name: r.message for r in results if not r.passed}


def test_numpy_backend_passes_every_check(fixture: Fixture) -> None:
    results = check_backend(_NumpyBackend(), fixture)
    assert failed(results) == {}
    names = [r.name for r in results]
    for expected in (
        "declares a name, precisions (a non-empty subset of ('fp32', 'fp64', 'fp16', 'bf16', 'f16', 'q8_0', "
        "'q4_0', 'q4_k')), requires, "
        "description and install_hint",
        "fp16 T=16: shapes and dtype float32",
        "supported taps: a subset of the manifest's, in dataflow order",
        "fp32 T=1: runs (single)",
        "fp64 T=16: runs (longest)",
        "fp64 T=16: returns exactly its declared taps",
        "fp32 T=1: shapes and dtype float32",
        "fp64 T=16: no NaN",
        "rejects a token id out of range (12)",
        "rejects a truncated weights file",
        "supports_decoding returns a bool",
        "fp32 decoding: runs and returns a dict of arrays by prompt",
        "fp64 decoding: shapes and dtype float64",
        "fp64 decoding: no NaN",
    ):
        assert expected in names
    # 1 declarations + 1 dependencies + 1 taps + 3 precisions (fp32, fp64, fp16) x 2 lengths x 4 + 3 bad inputs
    # + 1 supports_decoding + 2 precisions x 4 decoding checks (fp16 is not checked decoding)
    assert len(results) == 1 + 1 + 1 + 24 + 3 + 1 + 8


class BadPrecisions(NumpyBackend):
    precisions = ("fp8",)  # type: ignore[assignment]


class NoPrecisions(NumpyBackend):
    precisions = ()  # type: ignore[assignment]


class MissingDependency(NumpyBackend):
    requires = ("numpy", "surely_not_installed_module")  # type: ignore[assignment]
    install_hint = "pip install surely-not-installed"


class TapsOutOfOrder(NumpyBackend):
    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["logits", "hook_embed"]


class UnknownTap(NumpyBackend):
    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["hook_embed", "blocks.0.hook_resid_secret"]


class _Tamper(NumpyBackend):
    """A NumPy backend whose output is changed after the fact by `tamper`."""

    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        raise NotImplementedError

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = super().run(fixture, precision)
        self.tamper(out, precision)
        return out


class WrongDtype(_Tamper):
    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        for taps in out.values():
            taps["logits"] = taps["logits"].astype(np.float64 if precision == "fp32" else np.float32)


class WrongShape(_Tamper):
    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        for taps in out.values():
            taps["blocks.0.attn.hook_q"] = taps["blocks.0.attn.hook_q"].reshape(
                -1, 8
            )  # (T, d), not (T, H, dh)


class DropsATap(_Tamper):
    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        for taps in out.values():
            del taps["probs"]


class ExtraTap(_Tamper):
    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [t for t in fixture.tap_names if t != "probs"]

    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        for taps in out.values():
            taps["probs"] = taps["logits"]


class MakesNaN(_Tamper):
    def tamper(self, out: BackendOutput, precision: Precision) -> None:
        for taps in out.values():
            taps["hook_embed"] = np.full_like(taps["hook_embed"], np.nan)


class FailsOnOneToken(NumpyBackend):
    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if any(len(c.tokens) == 1 for c in fixture.cases):
            raise ValueError("cannot broadcast a single token")
        return super().run(fixture, precision)


class NoTokenCheck(NumpyBackend):
    """Indexes the embedding table without checking: an IndexError escapes."""

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        from parity_reference.numpy_model import forward

        params = {k: v.astype(DTYPES[precision]) for k, v in fixture.weights().items()}
        return {c.name: forward(params, fixture.config, list(c.tokens)) for c in fixture.cases}


class ClampsTokens(NumpyBackend):
    """Silently clamps bad token ids: it returns numbers for bad input."""

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        from parity_reference.numpy_model import forward

        V = fixture.config.vocab_size
        params = {k: v.astype(DTYPES[precision]) for k, v in fixture.weights().items()}
        return {
            c.name: forward(params, fixture.config, [min(t, V - 1) for t in c.tokens]) for c in fixture.cases
        }


class BadName(NumpyBackend):
    name: ClassVar[str] = "my backend, v2"


@pytest.mark.parametrize(
    ("backend_cls", "failing", "message"),
    [
        (BadPrecisions, ["declares a name, precisions"], "fp8"),
        (NoPrecisions, ["declares a name, precisions"], "()"),
        (MissingDependency, ["dependencies present"], "surely_not_installed_module"),
        (TapsOutOfOrder, ["supported taps"], "dataflow order"),
        (UnknownTap, ["supported taps"], "blocks.0.hook_resid_secret"),
        (
            WrongDtype,
            ["fp32 T=1: shapes and dtype", "fp32 T=16: shapes", "fp64 T=1: shapes", "fp64 T=16: shapes"],
            "logits",
        ),
        (
            WrongShape,
            ["fp32 T=1: shapes and dtype", "fp32 T=16: shapes", "fp64 T=1: shapes", "fp64 T=16: shapes"],
            "hook_q",
        ),
        (
            DropsATap,
            ["fp32 T=1: returns exactly", "fp32 T=16: returns", "fp64 T=1: returns", "fp64 T=16: returns"],
            "probs",
        ),
        (  # an undeclared tap stops a run (the boundary's rule), so the check that fails is "runs"
            ExtraTap,
            ["fp32 T=1: runs", "fp32 T=16: runs", "fp64 T=1: runs", "fp64 T=16: runs"],
            "probs",
        ),
        (
            MakesNaN,
            ["fp32 T=1: no NaN", "fp32 T=16: no NaN", "fp64 T=1: no NaN", "fp64 T=16: no NaN"],
            "hook_embed",
        ),
        (FailsOnOneToken, ["fp32 T=1: runs", "fp64 T=1: runs"], "ValueError"),
        (NoTokenCheck, ["rejects a token id out of range"], "IndexError"),
        (ClampsTokens, ["rejects a token id out of range"], "returned numbers"),
        (BadName, ["declares a name"], "my backend, v2"),
    ],
)
def test_broken_backend_fails_its_check(
    fixture: Fixture, backend_cls: type[NumpyBackend], failing: list[str], message: str
) -> None:
    fails = failed(check_backend(backend_cls(), fixture))
    assert len(fails) == len(failing), fails
    for prefix in failing:
        assert any(name.startswith(prefix) for name in fails), (prefix, fails)
    first = next(name for name in fails if name.startswith(failing[0]))
    assert message in fails[first], fails[first]


def test_declaration_failures_stop_before_running(fixture: Fixture) -> None:
    results = check_backend(MissingDependency(), fixture)
    assert [r.name for r in results][-1] == "dependencies present"
    assert "pip install surely-not-installed" in results[-1].message


def test_onnx_files_are_carried_into_derived_fixtures(tmp_path: Path, fixture: Fixture) -> None:
    """A backend that reads fixture.onnx_path(...) finds the parent's ONNX files in the small fixtures."""
    import json
    import shutil

    from parity_harness._tools.conformance import _rehash

    root = tmp_path / "with_onnx"
    shutil.copytree(fixture.root, root)
    (root / "model.onnx").write_bytes(b"not really onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["onnx"] = {"all_taps": "model.onnx"}
    manifest["sha256"]["model.onnx"] = ""
    (root / "manifest.json").write_text(json.dumps(manifest))
    _rehash(root)
    seen: list[bytes] = []

    class ReadsOnnx(NumpyBackend):
        def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
            path = fixture.onnx_path("all_taps")
            assert path is not None
            seen.append(path.read_bytes())
            return super().run(fixture, precision)

    assert failed(check_backend(ReadsOnnx(), load_fixture(root))) == {}
    assert seen and all(b == b"not really onnx" for b in seen)


def test_cli_check_backend_numpy(fixture: Fixture) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "parity_harness", "check-backend", "numpy", "--fixture", str(fixture.root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("check-backend numpy:")]
    assert len(lines) == 39 and all(": OK" in line for line in lines), proc.stdout  # as in the test above
    assert any("T=1" in line for line in lines) and any("T=16" in line for line in lines)


def test_a_llama_fixture_is_checked_in_its_own_family() -> None:
    """check-backend on toy-llama: derived fixtures of the Llama family (its NumPy reference's goldens, its taps), and
    the weights file missing its last tensor, lm_head.weight (it read GPT-2's config only, and named ln_f.bias)."""
    fixture = load_fixture(REPO / "fixtures" / "toy-llama")
    results = check_backend(_NumpyBackend(), fixture)
    assert {r.name: r.message for r in results if not r.passed} == {}
    names = [r.name for r in results]
    assert "rejects weights missing a tensor (lm_head.weight)" in names
    assert "fp64 T=16: returns exactly its declared taps" in names and "rejects a token id out of range (12)" in names
