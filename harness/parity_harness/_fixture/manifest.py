"""A fixture's manifest, parsed and checked as pure data: no file is opened here.

`parse_manifest` takes manifest.json's object and returns a frozen `Manifest`: the config, vocabulary, cases,
taps, tolerances (within their ceilings), the data files it names and the seal, every check the schema
(parity_harness/_fixture/schema.py) cannot say done once, each problem a `FixtureError` naming the manifest.
A `Manifest` is immutable all the way down (tuples, read-only mappings, frozen dataclasses; the object it
was parsed from kept as a `frozen_json` copy), so what it says cannot be edited after it is checked.
Everything that touches the disk (hashes, safetensors, caching, the backend's private copy) is
parity_harness/_fixture/fixture.py's `Fixture`, which holds a `Manifest`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import REDUCED, TIERS, Precision
from parity_harness._fixture.schema import SEAL_KEY, manifest_digest, validate_manifest
from parity_harness._fixture.tolerances import (
    REDUCED_C,
    default_problems,
    override_problems,
    reduced_c_problems,
)
from parity_reference.families import FamilyError

if TYPE_CHECKING:
    from parity_harness._fixture.model_spec import ModelSpec
    from parity_reference.families import ModelConfig

FORMAT_NAME = "parity-fixture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


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
    overrides: Mapping[str, Tolerance] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))  # read-only, its own copy

    def for_tap(self, tap: str) -> Tolerance:
        return self.overrides.get(tap, self.default)


@dataclass(frozen=True)
class Manifest:
    """A checked manifest. `where` is the path its errors name; `raw` the object it was parsed from."""

    raw: Mapping[str, Any] = field(repr=False)  # frozen_json: `thaw_json` gives an editable copy
    where: str
    model: ModelSpec  # the family's table and its config: every tap's facts (parity_harness/_fixture/model_spec.py)
    vocab: tuple[str, ...]
    cases: tuple[Case, ...]
    tap_names: tuple[str, ...]
    tap_rows: Mapping[str, int]  # taps whose golden keeps only the last positions ("rows", docs/fixture-format.md)
    tolerances: Mapping[Precision, TierTolerances]
    loose: tuple[str, ...]  # tolerances beyond their ceiling (only with allow_loose_tolerances)
    files: Mapping[str, Any]  # frozen_json
    file_names: tuple[str, ...]  # every data file it lists, each a plain name (not yet looked for)
    hashes: Mapping[str, str]
    seal: str
    allow_loose_tolerances: bool = False
    # c of the per-tap rule for fp16 and bf16: the manifest's `tolerances.reduced`, else the default REDUCED_C
    reduced_c: Mapping[Precision, float] = field(default_factory=lambda: dict(REDUCED_C))

    def __post_init__(self) -> None:
        """Every field read-only and its own: a caller's later edit of the object it was parsed from changes nothing."""
        for name in ("raw", "files"):
            object.__setattr__(self, name, frozen_json(getattr(self, name)))
        for name in ("tap_rows", "tolerances", "hashes", "reduced_c"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        for name in ("vocab", "cases", "tap_names", "loose", "file_names"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def _fail(self, what: str) -> FixtureError:
        return FixtureError(f"{self.where}: {what}")

    def override_problems(self, precision: Precision, magnitude: dict[str, float]) -> list[str]:
        """What breaks the ceiling: each per-tap override against the ceiling scaled by the largest golden
        magnitude up to that tap.

        `magnitude[tap]`: the largest finite |golden| of that tap over every case. Up to: of that tap
        and of every tap before it in dataflow order. Round-off carried from upstream scales with what
        the computation has carried: a softmax after scores of 1e4 is as far off as those scores'
        round-off (docs/tolerances.md). A bounded tap (probabilities, `tap_range`) counts it only up to
        a multiple of its own range, so no override can make uniform probabilities pass.
        """
        overrides = self.tolerances[precision].overrides
        problems: list[str] = []
        carried = 0.0
        for tap in self.tap_names:
            carried = max(carried, magnitude.get(tap, 0.0))
            if tap in overrides:
                tol = overrides[tap]
                problems += override_problems(precision, tap, tol.atol, tol.rtol, carried,
                                              self.model.value_range(tap))
        return problems

    def refuse_or_record(self, problems: list[str]) -> list[str]:
        """Tolerances beyond their ceiling: FixtureError, or the problems back when loose tolerances are allowed."""
        return refuse_loose(self.where, problems, self.allow_loose_tolerances)


def refuse_loose(where: str, problems: list[str], allowed: bool) -> list[str]:
    """The one rule for tolerances beyond their ceiling: refused (FixtureError), or returned to be recorded."""
    if problems and not allowed:
        raise FixtureError(f"{where}: {problems[0]}; a tolerance that loose lets wrong numbers pass "
                           "(see docs/tolerances.md; --allow-loose-tolerances runs anyway and flags every report)")
    return problems


def frozen_json(value: Any) -> Any:
    """A read-only deep copy of a JSON value: objects as read-only mappings, arrays as tuples (`thaw_json` undoes)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen_json(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(frozen_json(v) for v in value)
    return value


def thaw_json(value: Any) -> Any:
    """An editable deep copy of a `frozen_json` value (dicts and lists), what manifest.json's object was."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw_json(v) for v in value]
    return value


def check_format(raw: dict[str, Any], where: str) -> None:
    """The manifest says it is a parity fixture of the one format version this parity reads."""
    if raw.get("format") != FORMAT_NAME:
        raise FixtureError(f"{where}: not a parity fixture (format is {_json(raw.get('format'))})")
    version = raw.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # not true, not 1.0
        raise FixtureError(
            f"{where}: unknown fixture format version {_json(version)} "
            f"(this parity reads version {FORMAT_VERSION}, an integer); regenerate it with `parity export` "
            "or upgrade parity"
        )


def check_file_name(name: object, where: str) -> str:
    """A file name from a manifest: a plain name (no `/`, `\\`, `..`, NUL, not absolute); FixtureError if not."""
    if (not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0")
            or PurePath(name).is_absolute() or len(name.encode("utf-8", "surrogateescape")) > 255):
        raise FixtureError(f"{where}: file name {name!r} must be a plain name inside the fixture directory")
    return name


def parse_manifest(raw: dict[str, Any], where: str, allow_loose_tolerances: bool = False) -> Manifest:
    """Check a manifest object as data (schema, config, cases, taps, tolerances, files, seal) into a Manifest."""
    return _Parser(raw, where, allow_loose_tolerances).build()


class _Parser:
    """The checks of one manifest, in order; each problem a FixtureError naming `where`."""

    def __init__(self, manifest: dict[str, Any], where: str, allow_loose_tolerances: bool) -> None:
        self.manifest = manifest
        self.manifest_path = where
        self.allow_loose_tolerances = allow_loose_tolerances
        self.loose: list[str] = []

    def build(self) -> Manifest:
        problem = validate_manifest(self.manifest)
        if problem is not None:
            raise self._fail(problem)
        self.model = self._parse_model()
        self.config = self.model.config
        vocab = self._parse_vocab()
        cases = self._parse_cases()
        self.tap_names = self._parse_taps()
        tap_rows = {t["name"]: t["rows"] for t in self.manifest["taps"] if "rows" in t}
        for tap in tap_rows:
            if self.model.rows_axis(tap) is None:
                raise self._fail(f"tap {tap!r}: 'rows' on a tap without a position axis")
        tolerances: dict[Precision, TierTolerances] = {p: self._parse_tolerances(p) for p in TIERS}
        reduced = self._parse_reduced()
        self.files: dict[str, Any] = self._require(self.manifest, "files", dict)
        seal = self._check_seal()
        names = self._file_names()
        hashes = self._require(self.manifest, "sha256", dict)
        for name in names:
            check_file_name(name, self.manifest_path)  # a name pointing outside the fixture: refused first
            if name not in hashes:
                raise self._fail(f"no sha256 for {name!r}")
        for name in hashes:
            check_file_name(name, self.manifest_path)
        return Manifest(self.manifest, self.manifest_path, self.model, tuple(vocab), tuple(cases),
                        tuple(self.tap_names), tap_rows, tolerances, tuple(self.loose), self.files, tuple(names),
                        dict(hashes), seal, self.allow_loose_tolerances, reduced)

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

    def _parse_model(self) -> ModelSpec:
        """The family (absent: "gpt2", every fixture written before families) and its config."""
        from parity_harness._fixture.model_spec import DEFAULT_FAMILY, config_from, model_spec

        name = self.manifest.get("family", DEFAULT_FAMILY)
        if not isinstance(name, str):
            raise self._fail(f"'family' must be a string, got {type(name).__name__}")
        raw = self._require(self.manifest, "config", dict)
        try:
            return model_spec(name, config_from(name, raw))
        except FamilyError as exc:
            raise self._fail(str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise self._fail(f"bad config for the {name} family: {exc}") from None

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
        expected = self.model.tap_names()
        if names != expected:
            missing = [t for t in expected if t not in names]
            extra = [t for t in names if t not in expected]
            detail = f"missing {missing}" if missing else f"unknown {extra}" if extra else "wrong order"
            raise self._fail(f"taps do not match the model's tap list ({detail})")
        for t in raw_taps:
            if t.get("shape") != self.model.shape_template(t["name"]):
                raise self._fail(f"tap {t['name']!r}: shape {t.get('shape')} does not match the config")
        return expected

    def _parse_tolerances(self, precision: Precision) -> TierTolerances:
        """Finite, non-negative (the schema, strict JSON), and within the tier's ceiling."""
        tiers = self._require(self.manifest, "tolerances", dict)
        tier = self._require(tiers, precision, dict, "tolerances.")

        def tol(obj: dict[str, Any], where: str) -> Tolerance:
            atol = self._require(obj, "atol", float, where)
            rtol = self._require(obj, "rtol", float, where)
            if not (0 <= atol < float("inf") and 0 <= rtol < float("inf")):
                raise self._fail(f"{where}: negative or non-finite tolerance")
            return Tolerance(atol, rtol)

        overrides = tier.get("overrides", {})
        if not isinstance(overrides, dict):
            raise self._fail(f"tolerances.{precision}.overrides must be an object")
        for tap in overrides:
            if tap not in self.tap_names:
                raise self._fail(f"tolerances.{precision}.overrides: unknown tap {tap!r}")
        default = tol(tier, f"tolerances.{precision}.")
        self._loose(default_problems(precision, default.atol, default.rtol))
        return TierTolerances(
            default, {tap: tol(v, f"tolerances.{precision}.overrides.{tap}.") for tap, v in overrides.items()}
        )

    def _parse_reduced(self) -> dict[Precision, float]:
        """`tolerances.reduced`: c per reduced precision (optional; the schema checks the shape), within its ceiling."""
        stated = self.manifest["tolerances"].get("reduced", {})
        out = dict(REDUCED_C)
        for precision in REDUCED:
            if precision in stated:
                c = stated[precision]["c"]
                if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c <= 0:
                    raise self._fail(f"tolerances.reduced.{precision}.c must be a positive finite number")
                self._loose(reduced_c_problems(precision, float(c)))
                out[precision] = float(c)
        return out

    def _loose(self, problems: list[str]) -> None:
        self.loose += refuse_loose(self.manifest_path, problems, self.allow_loose_tolerances)

    def _check_seal(self) -> str:
        """The manifest's own hash: any edit (a tolerance, a hash, a case) needs a deliberate re-seal."""
        actual = manifest_digest(self.manifest)
        if self.manifest[SEAL_KEY] != actual:
            raise self._fail(
                f"manifest_sha256 mismatch (manifest says {str(self.manifest[SEAL_KEY])[:12]}..., content is "
                f"{actual[:12]}...): the manifest was edited after it was sealed; review the change, then "
                "re-seal with `parity seal --fixture DIR`"
            )
        return actual

    def _file_names(self) -> list[str]:
        names = [self._require(self.files, "weights", str, "files.")]
        golden = self._require(self.files, "golden", dict, "files.")
        names += [self._require(golden, p, str, "files.golden.") for p in TIERS]
        onnx = self.files.get("onnx", {})
        names += [v for v in onnx.values() if isinstance(v, str)] if isinstance(onnx, dict) else []
        decoding = self.files.get("decoding", {})  # optional (parity_harness/_fixture/decoding.py)
        names += [v for v in decoding.values() if isinstance(v, str)] if isinstance(decoding, dict) else []
        training = self.files.get("training", {})  # optional (parity_harness/_fixture/training_section.py)
        names += [v for v in training.values() if isinstance(v, str)] if isinstance(training, dict) else []
        return names



def _json(value: object) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
