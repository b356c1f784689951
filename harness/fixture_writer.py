"""Write a fixture directory (docs/fixture-format.md) from arrays: the one writer every fixture goes through.

`write_fixture_files` writes weights.safetensors, golden.fp32/fp64.safetensors, optionally the two
ONNX graphs, and manifest.json with the sha256 of every file and the seal (`manifest_sha256`, the
hash of the manifest itself). `seal_manifest(root)` re-seals an existing fixture after a reviewed
edit of its manifest (`parity seal --fixture DIR`). `parity export` (harness/export.py)
uses it for the toy, the conformance kit (harness/conformance.py) for its derived fixtures, and the
tests for their random-weight fixtures (tests/fixture_builders.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.fixture import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    Case,
    load_fixture,
    read_manifest,
    sha256_file,
)
from harness.manifest import SEAL_KEY, manifest_digest
from harness.onnx_graph import OnnxGraph
from harness.precision import DTYPES, PRECISIONS, Precision
from harness.tolerances import FP32_ATOL, FP32_RTOL, FP64_ATOL
from reference.config import GPTConfig
from reference.taps import tap_names, tap_shape_template

WEIGHTS_FILE = "weights.safetensors"
ONNX_FILES: dict[OnnxGraph, str] = {"all_taps": "model.onnx", "logits": "model.logits.onnx"}  # kind -> file name

# One tier's golden taps: golden[case name][tap name] -> array (any float dtype; cast on writing).
Golden = Mapping[str, Mapping[str, np.ndarray]]


def default_tolerances() -> dict[str, Any]:
    """The tolerances `parity export` writes (harness/export.py, docs/tolerances.md)."""
    return {
        "fp32": {"atol": FP32_ATOL, "rtol": FP32_RTOL, "overrides": {}},
        "fp64": {"atol": FP64_ATOL, "rtol": 0.0, "overrides": {}},
    }


def write_fixture_files(
    root: Path,
    *,
    config: GPTConfig,
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
) -> None:
    """Write a complete fixture directory into `root` (created if needed).

    `weights` are written as float32. `golden` gives each tier's taps, `golden[precision][case][tap]`,
    or is called once per precision to compute them; every tap of `config` must be there for every
    case, and is cast to the tier's dtype. `onnx`: False writes no graph, True exports both graphs
    from `weights` (harness.onnx_export, torch needed), a mapping {kind: path} copies existing files
    in. `tolerances` default to `default_tolerances()`. `progress` hears what is being computed.
    `tap_rows`: taps whose golden keeps only the last positions (the manifest's `rows`); their golden
    arrays must already be cut so. `lens_rows`: passed to the ONNX export (probs and the lens on the
    last positions only).
    """
    from safetensors.numpy import save_file

    say = progress or (lambda _message: None)
    root.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(root / WEIGHTS_FILE))
    files: dict[str, Any] = {"weights": WEIGHTS_FILE, "golden": {}}
    taps = tap_names(config.n_layer)
    for precision in PRECISIONS:
        say(f"golden {precision} taps for {len(cases)} cases")
        tier = golden(precision) if callable(golden) else golden[precision]
        name = f"golden.{precision}.safetensors"
        tensors = {
            f"{case.name}/{tap}": np.ascontiguousarray(tier[case.name][tap], dtype=DTYPES[precision])
            for case in cases
            for tap in taps
        }
        save_file(tensors, str(root / name))  # safetensors needs C order, hence ascontiguousarray
        files["golden"][precision] = name
    if onnx is True:
        from harness.onnx_export import export_onnx

        files["onnx"] = dict(ONNX_FILES)
        for kind, name in ONNX_FILES.items():
            say(f"ONNX graph {name}")
            export_onnx(dict(weights), config, root / name, kind, lens_rows=lens_rows)
    elif onnx:
        files["onnx"] = {}
        for kind, src in onnx.items():
            shutil.copyfile(src, root / src.name)
            files["onnx"][kind] = src.name
    names = [files["weights"], *files["golden"].values(), *files.get("onnx", {}).values()]
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "vocab": list(vocab),
        "cases": [{"name": c.name, "kind": c.kind, "tokens": list(c.tokens), "text": c.text} for c in cases],
        "taps": [{"name": t, "shape": tap_shape_template(config, t),
                  **({"rows": int(tap_rows[t])} if tap_rows and t in tap_rows else {})} for t in taps],
        "tolerances": dict(tolerances) if tolerances is not None else default_tolerances(),
        "files": files,
        "sha256": {name: sha256_file(root / name) for name in names},
        "provenance": dict(provenance),
    }
    manifest[SEAL_KEY] = manifest_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def seal_manifest(root: Path | str, rehash_files: bool = False, allow_loose_tolerances: bool = False) -> str:
    """Re-seal `root`/manifest.json after a reviewed edit; returns the new seal (hex sha256).

    The manifest must still be strict JSON and pass every check of `load_fixture` (schema, ceilings,
    file hashes) and the goldens' (`validate_golden`: the per-tap override ceilings), or nothing is
    changed and FixtureError says why. `rehash_files` first rewrites the
    sha256 of every listed file: for a data file changed on purpose.
    """
    root = Path(root)
    path = root / MANIFEST
    before = path.read_bytes()
    manifest = read_manifest(path)
    if rehash_files and isinstance(manifest.get("sha256"), dict):
        manifest["sha256"] = {name: sha256_file(root / name) for name in manifest["sha256"]}
    manifest[SEAL_KEY] = manifest_digest(manifest)
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    try:
        fixture = load_fixture(root, allow_loose_tolerances=allow_loose_tolerances)
        for precision in PRECISIONS:  # the per-tap override ceilings need the goldens' magnitudes
            fixture.validate_golden(precision)
    except BaseException:
        path.write_bytes(before)  # a manifest that does not load is not sealed
        raise
    return str(manifest[SEAL_KEY])


__all__ = ["ONNX_FILES", "Golden", "default_tolerances", "seal_manifest", "write_fixture_files"]
