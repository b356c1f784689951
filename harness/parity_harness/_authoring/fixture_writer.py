"""Write a fixture directory (docs/fixture-format.md) from arrays: the one writer every fixture goes through.

`write_fixture_files` writes weights.safetensors, golden.fp32/fp64.safetensors, optionally the two
ONNX graphs, and manifest.json with the sha256 of every file and the seal (`manifest_sha256`, the
hash of the manifest itself). `seal_manifest(root)` re-seals an existing fixture after a reviewed
edit of its manifest (`parity seal --fixture DIR`). `parity export` (parity_harness/_authoring/export.py)
uses it for the toy, the conformance kit (parity_harness/_tools/conformance.py) for its derived fixtures, and the
tests for their random-weight fixtures (tests/helpers.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._backends.onnx.graph import OnnxGraph
from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import DTYPES, TIERS, Precision
from parity_harness._core.safe_write import write_atomic_with, write_text_atomic
from parity_harness._core.strict_json import loads_strict
from parity_harness._fixture.fixture import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    Case,
    fixture_file,
    fixture_from_manifest,
    read_manifest,
    sha256_file,
)
from parity_harness._fixture.model_spec import DEFAULT_FAMILY, model_spec
from parity_harness._fixture.schema import SEAL_KEY, manifest_digest
from parity_harness._fixture.tolerances import FP32_ATOL, FP32_RTOL, FP64_ATOL

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

WEIGHTS_FILE = "weights.safetensors"
ONNX_FILES: dict[OnnxGraph, str] = {"all_taps": "model.onnx", "logits": "model.logits.onnx"}  # kind -> file name

# One tier's golden taps: golden[case name][tap name] -> array (any float dtype; cast on writing).
Golden = Mapping[str, Mapping[str, np.ndarray]]


def default_tolerances() -> dict[str, Any]:
    """The tolerances `parity export` writes (parity_harness/_authoring/export.py, docs/tolerances.md)."""
    return {
        "fp32": {"atol": FP32_ATOL, "rtol": FP32_RTOL, "overrides": {}},
        "fp64": {"atol": FP64_ATOL, "rtol": 0.0, "overrides": {}},
    }


def write_fixture_files(
    root: Path,
    *,
    config: ModelConfig,
    vocab: Sequence[str],
    cases: Sequence[Case],
    weights: Mapping[str, np.ndarray],
    golden: Mapping[Precision, Golden] | Callable[[Precision], Golden],
    onnx: bool | Mapping[OnnxGraph, Path] = False,
    provenance: Mapping[str, Any],
    tolerances: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    tap_rows: Mapping[str, int] | None = None,
    lens_rows: int | None = None,
    family: str = DEFAULT_FAMILY,
) -> None:
    """Write a complete fixture directory into `root` (created if needed).

    `weights` are written as float32. `golden` gives each tier's taps, `golden[precision][case][tap]`,
    or is called once per precision to compute them; every tap of `config` must be there for every
    case, and is cast to the tier's dtype. `onnx`: False writes no graph, True exports both graphs
    from `weights` (parity_harness._authoring.onnx_export, torch needed), a mapping {kind: path} copies existing files
    in. `tolerances` default to `default_tolerances()`. `progress` hears what is being computed.
    `tap_rows`: taps whose golden keeps only the last positions (the manifest's `rows`); their golden
    arrays must already be cut so. `lens_rows`: passed to the ONNX export (probs and the lens on the
    last positions only). `family`: the model family (its table gives the taps and their shapes); a manifest
    names it (top-level "family") unless it is "gpt2", so GPT-2 manifests are as before.
    """
    say = progress or (lambda _message: None)
    root.mkdir(parents=True, exist_ok=True)
    save_tensors({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, root / WEIGHTS_FILE)
    files: dict[str, Any] = {"weights": WEIGHTS_FILE, "golden": {}}
    spec = model_spec(family, config)
    taps = spec.tap_names()
    for precision in TIERS:
        say(f"golden {precision} taps for {len(cases)} cases")
        tier = golden(precision) if callable(golden) else golden[precision]
        name = f"golden.{precision}.safetensors"
        tensors = {
            f"{case.name}/{tap}": np.ascontiguousarray(tier[case.name][tap], dtype=DTYPES[precision])
            for case in cases
            for tap in taps
        }
        save_tensors(tensors, root / name)  # safetensors needs C order, hence ascontiguousarray
        files["golden"][precision] = name
    if onnx is True:
        from parity_harness._authoring.onnx_export import export_onnx

        files["onnx"] = dict(ONNX_FILES)
        for kind, name in ONNX_FILES.items():
            say(f"ONNX graph {name}")
            export_onnx(dict(weights), config, root / name, kind, lens_rows=lens_rows)
    elif onnx:
        files["onnx"] = {}
        for kind, src in onnx.items():
            copy_file(src, root / src.name)
            files["onnx"][kind] = src.name
    names = [files["weights"], *files["golden"].values(), *files.get("onnx", {}).values()]
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **({"family": family} if family != DEFAULT_FAMILY else {}),
        "config": config.to_dict(),
        "vocab": list(vocab),
        "cases": [{"name": c.name, "kind": c.kind, "tokens": list(c.tokens), "text": c.text} for c in cases],
        "taps": [{"name": t, "shape": spec.shape_template(t),
                  **({"rows": int(tap_rows[t])} if tap_rows and t in tap_rows else {})} for t in taps],
        "tolerances": dict(tolerances) if tolerances is not None else default_tolerances(),
        "files": files,
        "sha256": {name: sha256_file(root / name) for name in names},
        "provenance": dict(provenance),
    }
    manifest[SEAL_KEY] = manifest_digest(manifest)
    write_text_atomic(root / MANIFEST, json.dumps(manifest, indent=1) + "\n", "manifest")


def save_tensors(tensors: Mapping[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None,
                 what: str = "safetensors file") -> None:
    """safetensors' `save_file`, through a temporary file renamed into place (parity_harness/_core/safe_write.py)."""
    from safetensors.numpy import save_file

    write_atomic_with(path, lambda tmp: save_file(dict(tensors), str(tmp), metadata=metadata), what)


def copy_file(src: Path, dst: Path) -> None:
    """Copy a file into a fixture being written, through a temporary file renamed into place."""
    def copy(tmp: Path) -> None:
        shutil.copyfile(src, tmp)

    write_atomic_with(dst, copy, dst.name)


def seal_manifest(root: Path | str, rehash_files: bool = False, allow_loose_tolerances: bool = False) -> str:
    """Re-seal `root`/manifest.json after a reviewed edit; returns the new seal (hex sha256).

    The manifest must still be strict JSON and pass every check of `load_fixture` (schema, ceilings,
    file hashes) and the goldens' (`validate_golden`: the per-tap override ceilings), or nothing is
    changed and FixtureError says why. `rehash_files` first rewrites the sha256 of every listed file: for
    a data file changed on purpose; every name is checked (a plain name, a regular file inside the
    fixture directory) before any file is opened. The new manifest is checked in memory, then written
    atomically (parity_harness/_core/safe_write.py): a full disk leaves the old manifest, never a truncated one.
    """
    root = Path(root)
    path = root / MANIFEST
    if not os.path.isdir(root):  # never raises (a name too long is "not found")
        raise FixtureError(f"{root}: fixture directory not found")
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(root):  # rewritten through the link, another file would change
        raise FixtureError(f"{path}: a link to {real}, outside the fixture directory; parity seals only a "
                           "manifest inside it (copy the file in place of the link first)")
    manifest = read_manifest(path)
    if rehash_files and isinstance(manifest.get("sha256"), dict):
        paths = {name: fixture_file(root, name, path) for name in manifest["sha256"]}  # all checked, then read
        manifest["sha256"] = {name: sha256_file(p) for name, p in paths.items()}
    manifest[SEAL_KEY] = manifest_digest(manifest)
    text = json.dumps(manifest, indent=1) + "\n"
    fixture = fixture_from_manifest(root, loads_strict(text), allow_loose_tolerances=allow_loose_tolerances)
    for precision in TIERS:  # the per-tap override ceilings need the goldens' magnitudes
        fixture.validate_golden(precision)
    write_text_atomic(path, text, "manifest")
    return str(manifest[SEAL_KEY])


def fixture_kind(manifest: Mapping[str, Any]) -> str | None:
    """Which `parity export` made a fixture: its preset ("toy-stress", "gpt2-mini", ...), "toy", "from-hf", or None."""
    prov = manifest.get("provenance")
    if not isinstance(prov, dict):
        return None
    if isinstance(prov.get("preset"), str):
        return str(prov["preset"])
    command = prov.get("command")
    if command == "parity export":
        return "toy"
    if isinstance(command, str) and command.startswith("parity export --from-hf"):
        return "from-hf"
    return None


def owned_entries(target: Path, kind: str, option: str = "--fixture") -> frozenset[str]:
    """The entries of `target` parity may replace when it rewrites the fixture there as a `kind` fixture.

    Nothing (a new directory) when `target` does not exist or is empty. Otherwise `target` must be a
    fixture of the same kind (its manifest's provenance says so) holding nothing but its manifest and
    the files the manifest lists; else FixtureError (one line): parity never deletes a file it did
    not write (docs/security.md, "Files").
    """
    try:
        if not target.exists():
            return frozenset()
        if not target.is_dir():
            raise FixtureError(f"{option} {target}: exists and is not a directory; parity writes a fixture "
                               "directory there and never replaces what it did not write")
        entries = sorted(p.name for p in target.iterdir())
    except OSError as exc:
        raise FixtureError(f"{option} {target}: cannot read it ({exc.strerror or exc})") from None
    if not entries:
        return frozenset()
    refuse = (f"{option} {target}: a non-empty directory that is not a {kind} fixture parity wrote")
    if MANIFEST not in entries:
        raise FixtureError(f"{refuse} (no {MANIFEST}); choose a new or empty directory")
    try:
        manifest = read_manifest(target / MANIFEST)
    except FixtureError as exc:
        raise FixtureError(f"{refuse} ({exc})") from None
    found = fixture_kind(manifest)
    if found != kind:
        what = f"a {found} fixture" if found else "not made by `parity export`"
        raise FixtureError(f"{refuse} (it is {what}); choose a new or empty directory"
                           + (f", or pass --preset {found}" if found and found != "from-hf" else ""))
    listed = {MANIFEST, *(n for n in (manifest.get("sha256") or {}) if isinstance(n, str))}
    extra = [e for e in entries if e not in listed]
    if extra:
        raise FixtureError(f"{option} {target}: holds {extra[0]!r}, which is not a file of the fixture; parity "
                           "never deletes what it did not write: move it away first")
    for name in entries:
        if not (target / name).is_file() or (target / name).is_symlink():
            raise FixtureError(f"{option} {target}: {name!r} is not a regular file; parity replaces only the "
                               "files it wrote")
    return frozenset(entries)


__all__ = ["ONNX_FILES", "Golden", "default_tolerances", "fixture_kind", "owned_entries", "seal_manifest",
           "write_fixture_files"]
