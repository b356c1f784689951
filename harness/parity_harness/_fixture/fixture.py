"""A fixture directory: its manifest (parsed as pure data by parity_harness/_fixture/manifest.py) and its files.

Everything a backend or the comparison reads goes through here, so every check happens once:
strict JSON (parity_harness/_core/strict_json.py), the schema (parity_harness/_fixture/schema.py), then what the schema
cannot
say (taps match the config, token ids below vocab_size, tolerance ceilings, parity_harness/_fixture/tolerances.py),
the seal (`manifest_sha256`, the manifest's own hash, so a changed tolerance is a changed fixture),
file names, sha256 hashes, tensor names, shapes, dtypes and finiteness. Every problem raises
`FixtureError` with one line naming the file and what is wrong.

A `Fixture` is read-only: its cases, taps, rows, tolerances and vocabulary are the sealed manifest's
(`Manifest`, immutable), assigning a public attribute raises AttributeError, and `manifest` / `files`
hand out fresh copies; so the code that calls the judge (the API, a test through the pytest plugin)
cannot change what it judges with. Backends never get the harness's own objects: `Fixture.for_backend()`
is a private, editable copy (`BackendCopy`, which the judge refuses), and every array (weights, golden)
is read-only, backed by immutable bytes, so no backend can change what the comparison reads.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.input_files import MAX_MANIFEST_BYTES
from parity_harness._core.precision import DTYPES, TIERS, Precision
from parity_harness._core.strict_json import load_json_object
from parity_harness._fixture.files import TensorFile, frozen, open_checked, read_checked, read_safetensors, sha256_file
from parity_harness._fixture.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    Case,
    Manifest,
    TierTolerances,
    Tolerance,
    check_file_name,
    check_format,
    parse_manifest,
    thaw_json,
)
from parity_harness._fixture.tolerances import reduced_atol, tap_magnitude
from parity_reference.config import GPTConfig
from parity_reference.tensor_check import GOLDEN, WEIGHTS, Expected

if TYPE_CHECKING:
    from parity_harness._fixture.decoding_section import Decoding
    from parity_harness._fixture.model_spec import ModelSpec
    from parity_harness._fixture.training_section import TrainingSection
    from parity_reference.training import TrainingSpec

LAZY_GOLDEN_BYTES = 64 << 20  # a golden file larger than this is read one case at a time (streaming)


T = TypeVar("T")


class ReadOnlyList(list[T]):
    """A list that refuses every change (TypeError), equal to a list of the same items: what a `Fixture` hands out."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(f"this list {READ_ONLY}")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type, tuple[list[T]]]:  # copy and pickle build it whole, not item by item
        return type(self), (list(self),)


READ_ONLY = ("is read-only: a fixture's cases, taps, rows, tolerances and goldens are those of its sealed manifest "
             "(change the manifest and re-seal it with `parity seal` to judge with others)")


class Fixture:
    """A validated fixture. Weights and golden tensors are read (and checked) on first use.

    Read-only: what the judge reads (`cases`, `tap_names`, `tap_rows`, `tolerances`, `vocab`, `config`,
    `loose`, `seal`, the goldens) is derived from the sealed manifest, held as tuples, read-only mappings,
    frozen dataclasses and read-only arrays, and assigning any public attribute raises AttributeError
    (READ_ONLY); `manifest` and `files` are editable copies, made anew on each access. So the code that calls
    the judge (the API, a test through the pytest plugin) cannot change the verdict by editing the fixture.
    A backend gets `for_backend()`, a private copy it may edit, which the judge refuses to judge with.
    """

    def __init__(self, root: Path, manifest: dict[str, Any], allow_loose_tolerances: bool = False) -> None:
        self._root = root
        self._manifest_path = root / MANIFEST
        self._allow_loose_tolerances = allow_loose_tolerances
        self._spec: Manifest = parse_manifest(manifest, str(self._manifest_path), allow_loose_tolerances)  # pure
        self._vocab: list[str] = ReadOnlyList(self._spec.vocab)
        self._cases: list[Case] = ReadOnlyList(self._spec.cases)
        self._tap_names: list[str] = ReadOnlyList(self._spec.tap_names)
        self._tap_rows: Mapping[str, int] = self._spec.tap_rows
        self._tolerances: Mapping[Precision, TierTolerances] = self._spec.tolerances
        self._loose: list[str] = list(self._spec.loose)  # grows when a golden's magnitudes break an override's ceiling
        self._files: dict[str, Any] = thaw_json(self._spec.files)  # private: `files` hands out copies
        self._check_hashes()  # the IO: every listed file read once, against its sha256
        self._weights: dict[str, np.ndarray] | None = None
        self._golden: dict[Precision, dict[str, dict[str, np.ndarray]]] = {}
        self._golden_files: dict[Precision, TensorFile] = {}  # golden files checked by `validate_golden`, read lazily
        self._case_magnitudes: dict[tuple[Precision, str], dict[str, float]] = {}  # `golden_magnitudes`
        self._magnitudes: dict[str, float] | None = None  # M_tap of the fp32 golden (`tap_magnitudes`)

    def __setattr__(self, name: str, value: object) -> None:
        if not name.startswith("_"):
            raise AttributeError(f"Fixture.{name} {READ_ONLY}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if not name.startswith("_"):
            raise AttributeError(f"Fixture.{name} {READ_ONLY}")
        object.__delattr__(self, name)

    # -- what the judge reads: read-only, from the sealed manifest ---------------------------
    @property
    def root(self) -> Path:
        return self._root

    @property
    def manifest_path(self) -> Path:
        return self._manifest_path

    @property
    def allow_loose_tolerances(self) -> bool:
        return self._allow_loose_tolerances

    @property
    def spec(self) -> Manifest:
        """The checked manifest (immutable)."""
        return self._spec

    @property
    def config(self) -> GPTConfig:
        """The GPT-2 family's config. Code that serves every family reads `model.config`; a backend of the GPT-2
        family only never sees another family's fixture (the boundary declines it first), and anything else that
        asks gets one line."""
        config = self._spec.config
        if not isinstance(config, GPTConfig):
            raise FixtureError(f"{self.manifest_path}: a {self.family} fixture has no GPT-2 config "
                               "(this code reads the GPT-2 family only)")
        return config

    @property
    def model(self) -> ModelSpec:
        """The model's family and config: every tap's facts (parity_harness/_fixture/model_spec.py)."""
        return self._spec.model

    @property
    def family(self) -> str:
        """The model family's name: "gpt2" (every fixture written before families) or "llama"."""
        return self._spec.model.name

    @property
    def seal(self) -> str:
        """The manifest's own sha256 (`manifest_sha256`)."""
        return self._spec.seal

    @property
    def vocab(self) -> list[str]:
        return self._vocab

    @property
    def cases(self) -> list[Case]:
        return self._cases

    @property
    def tap_names(self) -> list[str]:
        return self._tap_names

    @property
    def tap_rows(self) -> Mapping[str, int]:
        return self._tap_rows

    @property
    def tolerances(self) -> Mapping[Precision, TierTolerances]:
        return self._tolerances

    @property
    def loose(self) -> list[str]:
        """The tolerances beyond their ceiling this fixture runs with (only with allow_loose_tolerances)."""
        return ReadOnlyList(self._loose)

    @property
    def manifest(self) -> dict[str, Any]:
        """manifest.json's object: an editable copy, made anew (editing it changes nothing here)."""
        return thaw_json(self._spec.raw)  # type: ignore[no-any-return]

    @property
    def files(self) -> dict[str, Any]:
        """The manifest's `files` section: an editable copy, made anew (editing it changes nothing here)."""
        return thaw_json(self._spec.files)  # type: ignore[no-any-return]

    # -- reading files ----------------------------------------------------------------------
    def _measure_golden(self, precision: Precision, case: Case, tensors: dict[str, np.ndarray]) -> None:
        """Keep M of each tap of one case's golden (`golden_magnitudes`), measured as the golden is checked."""
        self._case_magnitudes[(precision, case.name)] = {tap: tap_magnitude([tensors[tap]]) for tap in self.tap_names}

    def _check_overrides(self, precision: Precision) -> None:
        """Each per-tap override against its ceiling (`_check_override_ceilings`), from every case's magnitudes."""
        if self.tolerances[precision].overrides:
            magnitude: dict[str, float] = {}
            for case in self.cases:
                for tap, m in self._case_magnitudes[(precision, case.name)].items():
                    magnitude[tap] = max(magnitude.get(tap, 0.0), m)
            self._check_override_ceilings(precision, magnitude)

    def _check_override_ceilings(self, precision: Precision, magnitude: dict[str, float]) -> None:
        """Each per-tap override against its ceiling, from the goldens' magnitudes (`Manifest.override_problems`)."""
        self._loose += self._spec.refuse_or_record(self._spec.override_problems(precision, magnitude))

    def _check_hashes(self) -> None:
        """Every file the manifest hashes is a regular file inside the directory, with that sha256.

        The files are hashed two at a time (hashlib and file reads release the GIL: a GPT-2-sized fixture's
        2 GB took 1.4 s against 2.2 s one after another on 2 cores); a mismatch is reported in the manifest's order."""
        from concurrent.futures import ThreadPoolExecutor

        paths = {name: fixture_file(self._root, name, self._manifest_path) for name in self._spec.hashes}
        with ThreadPoolExecutor(2) as pool:
            hashed = dict(zip(paths, pool.map(sha256_file, paths.values()), strict=True))
        for name, digest in self._spec.hashes.items():
            path, actual = paths[name], hashed[name]
            if actual != digest:
                raise FixtureError(
                    f"{path}: sha256 mismatch (manifest {str(digest)[:12]}..., file {actual[:12]}...); "
                    "the file changed since the manifest was written"
                )

    def _safe_path(self, name: str) -> Path:
        return safe_name(self._root, name, self._manifest_path)

    # -- public API -------------------------------------------------------------------------
    @property
    def weights_path(self) -> Path:
        return self._safe_path(self._files["weights"])

    def golden_path(self, precision: Precision) -> Path:
        return self._safe_path(self._files["golden"][precision])

    def onnx_path(self, kind: str) -> Path | None:
        """The ONNX file of `kind` ("all_taps" or "logits") if the fixture lists one."""
        onnx = self._files.get("onnx", {})
        name = onnx.get(kind) if isinstance(onnx, dict) else None
        return self._safe_path(name) if name else None

    def parameter_count(self) -> int:
        """How many parameters the fixture's model has (from its config; no file is read)."""
        return sum(math.prod(shape) for shape in self.model.param_shapes().values())

    def decoding(self) -> Decoding | None:
        """The optional decoding section (prompts, steps; _fixture/decoding.py), checked; None if absent."""
        if not hasattr(self, "_decoding"):
            from parity_harness._fixture.decoding_section import parse_decoding_section

            self._decoding = parse_decoding_section(self.manifest, self.files, self.model.config,
                                                    str(self.manifest_path))
        return self._decoding

    def training(self) -> TrainingSpec | None:
        """The optional training section's spec (the backward's cases, the training step;
        _fixture/training_section.py), checked; None if absent."""
        section = self.training_section()
        return section.spec if section is not None else None

    def training_section(self) -> TrainingSection | None:
        """The whole training section (spec, c, measured units), checked; None if absent."""
        if not hasattr(self, "_training"):
            from parity_harness._fixture.training_section import check_no_decay, parse_training_section

            section = parse_training_section(self.manifest, self.files, {c.name: len(c.tokens) for c in self.cases},
                                             str(self.manifest_path))
            if section is not None:
                check_no_decay(section.spec, list(self.model.param_shapes()), str(self.manifest_path))
            self._training = section
        return self._training

    def grad_names(self) -> list[str]:
        """Every gradient of a case's backward, in backward order (parity_reference/training.py)."""
        from parity_reference.training import backward_names

        return backward_names(self.tap_names, list(self.model.param_shapes()))

    def training_golden_path(self, precision: Precision) -> Path:
        names = self.files.get("training")
        if not isinstance(names, dict) or not isinstance(names.get(precision), str):
            raise FixtureError(f"{self.manifest_path}: the fixture has no training section (no gradient goldens)")
        return self._safe_path(names[precision])

    def case(self, name: str) -> Case:
        for c in self.cases:
            if c.name == name:
                return c
        raise FixtureError(f"{self.manifest_path}: no case named {name!r}")

    def tap_shape(self, tap: str, case: Case) -> tuple[int, ...]:
        return self.model.tap_shape(tap, len(case.tokens))

    def golden_shape(self, tap: str, case: Case) -> tuple[int, ...]:
        """The shape the golden holds: `tap_shape`, cut to the last `rows` positions when the tap has rows."""
        shape = self.tap_shape(tap, case)
        rows = self.tap_rows.get(tap)
        if rows is None:
            return shape
        axis = self.model.rows_axis(tap)
        return tuple(min(rows, s) if i == axis else s for i, s in enumerate(shape))

    def manifest_tap_template(self, tap: str) -> list[int | str]:
        return self.model.shape_template(tap)

    def select_rows(self, tap: str, case: Case, array: np.ndarray) -> np.ndarray:
        """A backend's full-length result of a tap with rows, cut as the golden is; anything else unchanged."""
        rows = self.tap_rows.get(tap)
        if rows is None or not isinstance(array, np.ndarray) or array.shape != self.tap_shape(tap, case):
            return array
        axis = self.model.rows_axis(tap)
        if axis is None:  # the manifest refuses rows on such a tap
            return array
        index = [slice(None)] * array.ndim
        index[axis] = slice(-rows, None)
        return array[tuple(index)]

    def lens_rows(self) -> int | None:
        """The rows kept of `probs` and every `logit_lens.k` when they all agree (else None: compute all)."""
        lens = ["probs", *(t for t in self.tap_names if t.startswith("logit_lens."))]
        rows = {self.tap_rows.get(t) for t in lens}
        return rows.pop() if len(rows) == 1 else None

    def golden_table(self, precision: Precision) -> dict[str, Expected]:
        """What a tier's golden file holds: {"case/tap": its dtype and its golden shape}, every case and tap."""
        dtype = np.dtype(DTYPES[precision]).name
        return {f"{case.name}/{tap}": Expected((dtype,), self.golden_shape(tap, case))
                for case in self.cases for tap in self.tap_names}

    def _read_golden(self, precision: Precision, keep: bool) -> None:
        """Check a tier's golden file with the one checked reader (files.py): its header against
        `golden_table` (keys, dtypes, shapes, nothing extra), then each tensor one at a time (no NaN), each
        tap's magnitude measured as it goes, and the per-tap overrides against their ceilings. `keep`: the
        arrays are kept (read-only, `_golden`); else only the checked file, read again case by case later."""
        table = self.golden_table(precision)
        golden = open_checked(self.golden_path(precision), table, GOLDEN)
        kept: dict[str, dict[str, np.ndarray]] = {case.name: {} for case in self.cases}
        measured: dict[tuple[Precision, str], dict[str, float]] = {(precision, c.name): {} for c in self.cases}
        for key, tensor in read_checked(golden, table, GOLDEN):
            case, tap = key.split("/", 1)  # a case name has no "/" (the manifest's schema)
            measured[(precision, case)][tap] = tap_magnitude([tensor])
            if keep:
                kept[case][tap] = tensor
        self._case_magnitudes.update(measured)
        self._check_overrides(precision)
        if keep:
            self._golden[precision] = kept
        else:
            self._golden_files[precision] = golden

    def preload_golden(self, precision: Precision) -> None:
        """Before any backend runs: read and check a tier's golden file, keeping it in memory when it is
        at most LAZY_GOLDEN_BYTES (the toy), else checking it tensor by tensor and reading each case
        again when it is compared (a GPT-2-sized fixture: memory bounded by one case)."""
        if self.golden_path(precision).stat().st_size <= LAZY_GOLDEN_BYTES:
            self.golden(precision)
        else:
            self.validate_golden(precision)

    def validate_golden(self, precision: Precision) -> None:
        """Check a golden file as `golden` does, one tensor at a time (nothing is kept but each tap's
        magnitude): `_read_golden`. Done once per tier; later reads (`golden_case`, `golden_tap`) use the
        header checked here and refuse the file if it is no longer the same file."""
        if precision in self._golden_files or precision in self._golden:
            return
        self._read_golden(precision, keep=False)

    def golden_case(self, precision: Precision, case: str,
                    taps: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """One case's golden taps {tap: read-only array}, read lazily from the file (nothing cached); `taps`:
        only those (in dataflow order), as a backend that declares fewer taps needs, else every tap.

        No NaN check here: `validate_golden` made it on this file, and the read refuses a file that
        changed since (a NaN in a golden would fail the comparison anyway). Each array is backed by
        the immutable bytes it was read into (`TensorFile`), so it needs no read-only copy."""
        wanted = None if taps is None else set(taps)
        names = [t for t in self.tap_names if wanted is None or t in wanted]
        if precision in self._golden:
            held = self._golden[precision][case]
            return {tap: held[tap] for tap in names}
        self.validate_golden(precision)
        golden, c = self._golden_files[precision], self.case(case)
        with golden.reading() as read:  # its header was checked against the table (`_read_golden`)
            return {tap: read(f"{c.name}/{tap}") for tap in names}

    def golden_magnitudes(self, precision: Precision, case: str) -> dict[str, float]:
        """M of each tap of one case's golden (`tap_magnitude`: max |value| over its finite cells), measured
        once per fixture: as the file is checked, or on first use for a golden held in memory."""
        self.validate_golden(precision)  # a file read lazily is measured as it is checked
        key = (precision, case)
        if key not in self._case_magnitudes:
            self._measure_golden(precision, self.case(case), self.golden_case(precision, case))
        return dict(self._case_magnitudes[key])

    def tap_magnitudes(self) -> dict[str, float]:
        """M_tap of every tap: max |fp32 golden| over the cases and finite cells (from `golden_magnitudes`, cached)."""
        if self._magnitudes is None:
            magnitude: dict[str, float] = {}
            for case in self.cases:
                for tap, m in self.golden_magnitudes("fp32", case.name).items():
                    magnitude[tap] = max(magnitude.get(tap, 0.0), m)
            self._magnitudes = magnitude
        return dict(self._magnitudes)

    def reduced_tolerance(self, precision: Precision, tap: str) -> Tolerance:
        """A reduced precision's tolerance at a tap, in either golden tier: atol c * eps * M_tap, rtol 0."""
        return Tolerance(reduced_atol(precision, self.spec.reduced_c[precision], self.tap_magnitudes()[tap],
                                      self.model.value_range(tap)), 0.0)

    def golden_tap(self, precision: Precision, case: str, tap: str) -> np.ndarray:
        """One golden tensor of one case (read-only), read on its own (the diagnosis of a failing tap needs one)."""
        if precision in self._golden:
            return self._golden[precision][case][tap]
        self.validate_golden(precision)
        golden = self._golden_files[precision]
        with golden.reading() as read:
            return read(f"{self.case(case).name}/{tap}")

    def weights(self) -> dict[str, np.ndarray]:
        """The float32 parameters under Hugging Face names, checked against the config by the one checked
        reader (files.py): every name, float32, its shape, nothing extra, then finite, one tensor at a time."""
        if self._weights is None:
            table = {name: Expected(("float32",), shape) for name, shape in self.model.param_shapes().items()}
            # Each tensor read straight into immutable bytes: read-only, with no second copy.
            self._weights = dict(read_checked(open_checked(self.weights_path, table, WEIGHTS), table, WEIGHTS))
        return dict(self._weights)  # a fresh dict of read-only arrays: nobody can change the harness's

    def release_weights(self) -> None:
        """Forget the weights read by `weights()` when the file is large (each backend reads its own copy
        then, and frees it when it is done): the harness itself holds no GPT-2-sized arrays while backends run."""
        if self.weights_path.stat().st_size > LAZY_GOLDEN_BYTES:
            self._weights = None

    def check_before_running(self) -> None:
        """Before any backend runs (`parity run`, `parity compare`, the API): both golden files and the weights
        validated, so a broken fixture costs no backend time; a GPT-2-sized copy of the weights is not kept.
        A backend's copy (`for_backend`, editable) is refused: the judge reads only a sealed, read-only fixture."""
        if isinstance(self, BackendCopy):
            raise FixtureError(f"{self.manifest_path}: a backend's copy of a fixture (Fixture.for_backend(), "
                               "editable) is not a fixture to judge with; pass the fixture load() returned")
        for precision in TIERS:
            self.preload_golden(precision)
        self.weights()
        self.release_weights()

    def golden(self, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        """The reference taps {case: {tap: array}} of one tier, checked: every key, shape, dtype, no NaN
        (`_read_golden`, keeping the arrays)."""
        if precision not in self._golden:
            self._read_golden(precision, keep=True)
        return {case: dict(taps) for case, taps in self._golden[precision].items()}

    def for_backend(self) -> BackendCopy:
        """A private copy for a backend: its own editable manifest, files, cases, taps, tolerances (lists and
        dicts, `BackendCopy`); the same read-only arrays. Nothing it does to it reaches this fixture, and the
        judge refuses it (`check_before_running`): an edited copy is not the sealed fixture."""
        clone = object.__new__(BackendCopy)
        clone.__dict__.update(self.__dict__)  # the private state, each mutable part replaced by its own copy below
        own = isinstance(self, BackendCopy)
        clone._manifest = copy.deepcopy(self.manifest) if own else self.manifest  # `manifest`: a fresh copy here
        clone._files = copy.deepcopy(self._files)
        clone._vocab, clone._cases, clone._tap_names = list(self._vocab), list(self._cases), list(self._tap_names)
        clone._tap_rows = dict(self._tap_rows)
        clone._tolerances = {p: _own_tier(t) for p, t in self._tolerances.items()}
        clone._spec = dataclasses.replace(self._spec, tolerances={p: _own_tier(t) for p, t in self._tolerances.items()})
        clone._loose = list(self._loose)
        clone._golden = {p: {c: dict(t) for c, t in g.items()} for p, g in self._golden.items()}
        clone._golden_files = dict(self._golden_files)  # each immutable: its header as a read-only mapping
        clone._case_magnitudes = {k: dict(m) for k, m in self._case_magnitudes.items()}
        clone._magnitudes = dict(self._magnitudes) if self._magnitudes is not None else None
        clone._weights = dict(self._weights) if self._weights is not None else None
        return clone

    def tolerance_summary(self) -> dict[str, Any]:
        """The tolerances in force, for reports: per tier atol, rtol, overrides and, when the fixture has
        any, `rows` ({tap: N}: only the last N positions of the tap are compared, in both tiers); the
        loose ones listed. Reports print it and `parity merge` refuses shards whose summaries differ."""
        rows = {"rows": dict(self.tap_rows)} if self.tap_rows else {}
        return {
            "tiers": {p: {"atol": t.default.atol, "rtol": t.default.rtol,
                          "overrides": {tap: {"atol": o.atol, "rtol": o.rtol} for tap, o in t.overrides.items()},
                          **copy.deepcopy(rows)}
                      for p, t in self.tolerances.items()},
            "loose": list(self.loose),
            "reduced_c": dict(self.spec.reduced_c),  # c of each reduced precision's atol c * eps * M_tap
            "manifest_sha256": self.seal,
        }


def _own_tier(tier: TierTolerances) -> TierTolerances:
    """A tier's tolerances as a backend's copy holds them: its own object, its overrides a plain dict. A backend that
    edits them (even through `object.__setattr__` on the frozen dataclass) edits its copy, never the judge's."""
    own = copy.copy(tier)
    object.__setattr__(own, "overrides", dict(tier.overrides))
    return own


class BackendCopy(Fixture):
    """What a backend is handed (`Fixture.for_backend`): its own copy, editable as the fixture was before it
    became read-only (`copy.cases = [...]`, `copy.manifest[...] = ...`), never judged with."""

    _manifest: dict[str, Any]
    # editable here (assignment sets the private attribute the base class's property reads)
    vocab: list[str]
    cases: list[Case]
    tap_names: list[str]
    tap_rows: dict[str, int]  # type: ignore[assignment]
    tolerances: dict[Precision, TierTolerances]  # type: ignore[assignment]

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name if name.startswith("_") else f"_{name}", value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name if name.startswith("_") else f"_{name}")

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    @property
    def files(self) -> dict[str, Any]:
        return self._files


def load_fixture(root: str | Path, allow_loose_tolerances: bool = False) -> Fixture:
    """Read and validate a fixture directory; FixtureError (exit 2) on any problem.

    Tolerances beyond their ceiling (parity_harness/_fixture/tolerances.py) are refused unless
    `allow_loose_tolerances`, which records them in `Fixture.loose` for every report to show.
    """
    root = Path(root)
    manifest_path = root / MANIFEST
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise FixtureError(f"{root}: fixture directory not found") from None
    except OSError as exc:
        raise FixtureError(f"{root}: cannot read the fixture directory ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FixtureError(f"{root}: not a fixture directory (not a directory)")
    manifest = read_manifest(manifest_path)
    return fixture_from_manifest(root, manifest, allow_loose_tolerances)


def fixture_from_manifest(root: Path, manifest: dict[str, Any], allow_loose_tolerances: bool = False) -> Fixture:
    """Validate a manifest (already read, or about to be written by `parity seal`) as the fixture at `root`."""
    check_format(manifest, str(root / MANIFEST))
    return Fixture(root, manifest, allow_loose_tolerances)


def read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json as strict JSON (no NaN, Infinity or repeated keys), a JSON object; FixtureError if not."""
    return load_json_object(path, "manifest", MAX_MANIFEST_BYTES)


def safe_name(root: Path, name: object, manifest_path: Path) -> Path:
    """`root / name` for a file name from a manifest: a plain name (`manifest.check_file_name`).

    Checked before any file is opened (`parity seal --rehash-files` too); FixtureError naming the manifest.
    """
    return root / check_file_name(name, str(manifest_path))


def fixture_file(root: Path, name: object, manifest_path: Path) -> Path:
    """A data file the manifest lists: a plain name (`safe_name`) whose file, symlinks followed, is a
    regular file inside the fixture directory; FixtureError (one line) before anything is read otherwise."""
    path = safe_name(root, name, manifest_path)
    try:
        inside = path.resolve().parent == root.resolve()
        st = os.stat(path)
    except FileNotFoundError:
        raise FixtureError(f"{path}: file not found (listed in the manifest)") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise FixtureError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if not inside:
        raise FixtureError(f"{path}: a symlink to a file outside the fixture directory (listed in the manifest)")
    if not stat.S_ISREG(st.st_mode):
        raise FixtureError(f"{path}: not a regular file (listed in the manifest)")
    return path


def default_fixture_dir() -> Path:
    """The toy fixture of the checkout parity runs from, else the copy installed with it."""
    from parity_harness._core.resources import toy_fixture_dir

    return toy_fixture_dir()


def too_big(fixture: Fixture, limit: int, why: str) -> str | None:
    """A backend's `declines` reason when the fixture's model has more than `limit` parameters, else None."""
    n = fixture.parameter_count()
    return f"declined above {limit:,} parameters (this model has {n:,}): {why}" if n > limit else None


__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST",
    "BackendCopy",
    "Case",
    "Fixture",
    "Manifest",
    "TierTolerances",
    "Tolerance",
    "default_fixture_dir",
    "fixture_file",
    "fixture_from_manifest",
    "frozen",
    "load_fixture",
    "read_manifest",
    "read_safetensors",
    "safe_name",
    "sha256_file",
    "too_big",
]
