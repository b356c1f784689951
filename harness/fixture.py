"""Load and validate a fixture directory (manifest.json + safetensors), without torch.

Everything a backend or the comparison reads goes through here, so every check happens once:
format version, config, cases, taps, file names, sha256 hashes, tensor names, shapes, dtypes and
finiteness. Every problem raises `FixtureError` with one line naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.backends.base import PRECISIONS, Precision
from harness.errors import FixtureError
from reference.config import GPTConfig, param_shapes
from reference.taps import tap_names as expected_tap_names
from reference.taps import tap_shape_template

if TYPE_CHECKING:
    from harness.decoding import Decoding

FORMAT_NAME = "parity-fixture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DTYPES: dict[Precision, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64}


@dataclass(frozen=True)
class Case:
    name: str  # unique; the prefix of the case's keys in golden files ("{name}/{tap}")
    tokens: tuple[int, ...]  # token ids, 1 <= len <= n_ctx
    kind: str = ""  # why it is there: "grammar", "random", "single", "longest", ...
    text: str = ""  # the words, for people


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class TierTolerances:
    default: Tolerance
    overrides: dict[str, Tolerance] = field(default_factory=dict)

    def for_tap(self, tap: str) -> Tolerance:
        return self.overrides.get(tap, self.default)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as numpy arrays; FixtureError if the file is unreadable."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return dict(load_file(str(path)))
    except FileNotFoundError:
        raise FixtureError(f"{path}: file not found") from None
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise FixtureError(f"{path}: not a readable safetensors file ({exc})") from None


class Fixture:
    """A validated fixture. Weights and golden tensors are read (and checked) on first use."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self.manifest_path = root / MANIFEST
        self.config = self._parse_config()
        self.vocab: list[str] = self._parse_vocab()
        self.cases: list[Case] = self._parse_cases()
        self.tap_names: list[str] = self._parse_taps()
        self.tolerances: dict[Precision, TierTolerances] = {p: self._parse_tolerances(p) for p in PRECISIONS}
        self.files: dict[str, Any] = self._require(manifest, "files", dict)
        self._check_hashes()
        self._weights: dict[str, np.ndarray] | None = None
        self._golden: dict[Precision, dict[str, dict[str, np.ndarray]]] = {}

    # -- manifest parsing -------------------------------------------------------------------
    def _fail(self, what: str) -> FixtureError:
        return FixtureError(f"{self.manifest_path}: {what}")

    def _require(self, obj: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
        if key not in obj:
            raise self._fail(f"missing key {where}{key!r}")
        value = obj[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self._fail(f"{where}{key!r} must be a {kind.__name__}, got {type(value).__name__}")
        return value

    def _parse_config(self) -> GPTConfig:
        raw = self._require(self.manifest, "config", dict)
        try:
            return GPTConfig.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise self._fail(f"bad config: {exc}") from None

    def _parse_vocab(self) -> list[str]:
        vocab = self._require(self.manifest, "vocab", list)
        if len(vocab) != self.config.vocab_size or not all(isinstance(w, str) for w in vocab):
            raise self._fail(f"vocab must be {self.config.vocab_size} strings, got {len(vocab)} entries")
        return list(vocab)

    def _parse_cases(self) -> list[Case]:
        raw_cases = self._require(self.manifest, "cases", list)
        if not raw_cases:
            raise self._fail("no cases")
        cases: list[Case] = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_cases):
            if not isinstance(raw, dict):
                raise self._fail(f"case #{i} is not an object")
            name = self._require(raw, "name", str, f"cases[{i}].")
            if not name or "/" in name or name in seen:
                raise self._fail(f"case #{i}: name {name!r} is empty, contains '/', or is repeated")
            seen.add(name)
            tokens = self._require(raw, "tokens", list, f"case {name!r}: ")
            if not tokens:
                raise self._fail(f"case {name!r}: empty token sequence")
            if len(tokens) > self.config.n_ctx:
                raise self._fail(
                    f"case {name!r}: {len(tokens)} tokens, longer than the context ({self.config.n_ctx})"
                )
            for t in tokens:
                if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.config.vocab_size:
                    raise self._fail(
                        f"case {name!r}: token id {t!r} out of range [0, {self.config.vocab_size})"
                    )
            cases.append(Case(name, tuple(tokens), str(raw.get("kind", "")), str(raw.get("text", ""))))
        return cases

    def _parse_taps(self) -> list[str]:
        raw_taps = self._require(self.manifest, "taps", list)
        names = [t.get("name") if isinstance(t, dict) else None for t in raw_taps]
        expected = expected_tap_names(self.config.n_layer)
        if names != expected:
            missing = [t for t in expected if t not in names]
            extra = [t for t in names if t not in expected]
            detail = f"missing {missing}" if missing else f"unknown {extra}" if extra else "wrong order"
            raise self._fail(f"taps do not match the model's tap list ({detail})")
        for t in raw_taps:
            if t.get("shape") != tap_shape_template(self.config, t["name"]):
                raise self._fail(f"tap {t['name']!r}: shape {t.get('shape')} does not match the config")
        return expected

    def _parse_tolerances(self, precision: Precision) -> TierTolerances:
        tiers = self._require(self.manifest, "tolerances", dict)
        tier = self._require(tiers, precision, dict, "tolerances.")

        def tol(obj: dict[str, Any], where: str) -> Tolerance:
            atol = self._require(obj, "atol", float, where)
            rtol = self._require(obj, "rtol", float, where)
            if atol < 0 or rtol < 0:
                raise self._fail(f"{where}: negative tolerance")
            return Tolerance(atol, rtol)

        overrides = tier.get("overrides", {})
        if not isinstance(overrides, dict):
            raise self._fail(f"tolerances.{precision}.overrides must be an object")
        for tap in overrides:
            if tap not in self.tap_names:
                raise self._fail(f"tolerances.{precision}.overrides: unknown tap {tap!r}")
        return TierTolerances(
            tol(tier, f"tolerances.{precision}."),
            {tap: tol(v, f"tolerances.{precision}.overrides.{tap}.") for tap, v in overrides.items()},
        )

    def _check_hashes(self) -> None:
        hashes = self._require(self.manifest, "sha256", dict)
        for name in self._file_names():
            self._safe_path(name)  # a name pointing outside the fixture is refused before anything else
            if name not in hashes:
                raise self._fail(f"no sha256 for {name!r}")
        for name, digest in hashes.items():
            path = self._safe_path(name)
            if not path.is_file():
                raise FixtureError(f"{path}: file not found (listed in the manifest)")
            actual = sha256_file(path)
            if actual != digest:
                raise FixtureError(
                    f"{path}: sha256 mismatch (manifest {str(digest)[:12]}..., file {actual[:12]}...); "
                    "the file changed since the manifest was written"
                )

    def _file_names(self) -> list[str]:
        names = [self._require(self.files, "weights", str, "files.")]
        golden = self._require(self.files, "golden", dict, "files.")
        names += [self._require(golden, p, str, "files.golden.") for p in PRECISIONS]
        onnx = self.files.get("onnx", {})
        names += [v for v in onnx.values() if isinstance(v, str)] if isinstance(onnx, dict) else []
        decoding = self.files.get("decoding", {})  # optional (harness/decoding.py)
        names += [v for v in decoding.values() if isinstance(v, str)] if isinstance(decoding, dict) else []
        return names

    def _safe_path(self, name: str) -> Path:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise self._fail(f"file name {name!r} must be a plain name inside the fixture directory")
        return self.root / name

    # -- public API -------------------------------------------------------------------------
    @property
    def weights_path(self) -> Path:
        return self._safe_path(self.files["weights"])

    def golden_path(self, precision: Precision) -> Path:
        return self._safe_path(self.files["golden"][precision])

    def onnx_path(self, kind: str) -> Path | None:
        """The ONNX file of `kind` ("all_taps" or "logits") if the fixture lists one."""
        onnx = self.files.get("onnx", {})
        name = onnx.get(kind) if isinstance(onnx, dict) else None
        return self._safe_path(name) if name else None

    def decoding(self) -> Decoding | None:
        """The optional decoding section (prompts, steps; harness/decoding.py), checked; None if absent."""
        if not hasattr(self, "_decoding"):
            from harness.decoding import parse_decoding

            self._decoding = parse_decoding(self)
        return self._decoding

    def case(self, name: str) -> Case:
        for c in self.cases:
            if c.name == name:
                return c
        raise FixtureError(f"{self.manifest_path}: no case named {name!r}")

    def tap_shape(self, tap: str, case: Case) -> tuple[int, ...]:
        from reference.taps import tap_shape

        return tap_shape(self.config, tap, len(case.tokens))

    def weights(self) -> dict[str, np.ndarray]:
        """The float32 parameters under Hugging Face names, checked against the config."""
        if self._weights is None:
            path = self.weights_path
            tensors = read_safetensors(path)
            expected = param_shapes(self.config)
            for name, shape in expected.items():
                if name not in tensors:
                    raise FixtureError(f"{path}: missing tensor {name!r} (expected shape {list(shape)})")
                t = tensors[name]
                if t.dtype != np.float32:
                    raise FixtureError(f"{path}: tensor {name!r} is {t.dtype}, expected float32")
                if t.shape != shape:
                    raise FixtureError(f"{path}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
                if not np.isfinite(t).all():
                    raise FixtureError(f"{path}: tensor {name!r} has non-finite values (NaN or Inf)")
            extra = sorted(set(tensors) - set(expected))
            if extra:
                raise FixtureError(f"{path}: unexpected tensor(s) {', '.join(map(repr, extra))}")
            self._weights = {name: tensors[name] for name in expected}
        return self._weights

    def golden(self, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        """The reference taps {case: {tap: array}} of one tier, checked: every key, shape, dtype, no NaN."""
        if precision not in self._golden:
            path = self.golden_path(precision)
            tensors = read_safetensors(path)
            dtype = DTYPES[precision]
            out: dict[str, dict[str, np.ndarray]] = {}
            for case in self.cases:
                out[case.name] = {}
                for tap in self.tap_names:
                    key = f"{case.name}/{tap}"
                    if key not in tensors:
                        raise FixtureError(f"{path}: missing golden tensor {key!r}")
                    t = tensors[key]
                    shape = self.tap_shape(tap, case)
                    if t.dtype != dtype:
                        raise FixtureError(f"{path}: golden tensor {key!r} is {t.dtype}, expected {np.dtype(dtype)}")
                    if t.shape != shape:
                        raise FixtureError(
                            f"{path}: golden tensor {key!r} has shape {list(t.shape)}, expected {list(shape)}"
                        )
                    if np.isnan(t).any():
                        raise FixtureError(f"{path}: golden tensor {key!r} holds NaN (a broken fixture)")
                    out[case.name][tap] = t
            extra = sorted(set(tensors) - {f"{c.name}/{t}" for c in self.cases for t in self.tap_names})
            if extra:
                raise FixtureError(f"{path}: unexpected golden tensor(s) {', '.join(map(repr, extra[:3]))}")
            self._golden[precision] = out
        return self._golden[precision]


def load_fixture(root: str | Path) -> Fixture:
    """Read and validate a fixture directory; FixtureError (exit 2) on any problem."""
    root = Path(root)
    manifest_path = root / MANIFEST
    if not root.is_dir():
        raise FixtureError(f"{root}: fixture directory not found")
    if not manifest_path.is_file():
        raise FixtureError(f"{manifest_path}: file not found")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FixtureError(f"{manifest_path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise FixtureError(f"{manifest_path}: the manifest must be a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise FixtureError(f"{manifest_path}: not a parity fixture (format is {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise FixtureError(
            f"{manifest_path}: unknown fixture format version {version!r} "
            f"(this parity reads version {FORMAT_VERSION}); regenerate it with `parity export` or upgrade parity"
        )
    return Fixture(root, manifest)


def default_fixture_dir() -> Path:
    """The toy fixture of the checkout parity runs from, else the copy installed with it."""
    from harness.resources import toy_fixture_dir

    return toy_fixture_dir()
