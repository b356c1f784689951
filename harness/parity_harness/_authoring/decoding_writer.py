"""Making the decoding goldens (`parity export`): prompts, greedy tokens, goldens and the decoder graph.

The goldens come from the full forward pass of the reference (parity_reference/run.py) over each prompt
plus its greedy tokens, so incremental decoding is checked against it (docs/decoding.md). A Llama fixture's
come from parity_reference/llama_model.py's forward: its cache keys are `hook_rot_k` (after RoPE, as
`llama_model.prefill` caches them) and keys and values keep the n_kv_heads heads ([n_kv_heads, T, d_head]). Reading
and checking them is parity_harness/_fixture/decoding.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.errors import FixtureError, ParityError
from parity_harness._core.precision import DTYPES, TIERS
from parity_harness._fixture.decoding import (
    CACHE_LAYOUT,
    DEFAULT_PROMPTS,
    DEFAULT_STEPS,
    GOLDEN_FILES,
    ONNX_FILE,
    Prompt,
    decode_tap_names,
    encode_words,
    step_key,
    top2_margin,
)

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig
    from parity_reference.run import RunWithTaps


def family_forward(family: str) -> tuple[RunWithTaps, str]:
    """The family's reference forward (its table's `torch` module) and the tap its cache keys are read from
    (its table's `decoding.cache_keys`, relative to "blocks.{i}.attn.")."""
    from parity_harness._fixture.model_spec import family as family_table

    table = family_table(family)
    run_with_taps: RunWithTaps = table.module("torch").run_with_taps
    return run_with_taps, table.decoding["cache_keys"].removeprefix("attn.")


def golden_from_forward(
    taps: Mapping[str, np.ndarray], n_layer: int, n_prompt: int, steps: int, key_tap: str = "hook_k"
) -> dict[str, np.ndarray]:
    """Decoding goldens of one prompt from the full forward's taps over prompt + the N fed tokens.

    `key_tap`: the tap the cached keys are (`hook_rot_k` for Llama: keys are cached after RoPE)."""
    out: dict[str, np.ndarray] = {}
    for k in range(steps + 1):
        n_pos = n_prompt + k  # positions in the cache after step k
        for i in range(n_layer):
            for tap, src in (("cache_k", key_tap), ("cache_v", "hook_v")):
                full = np.asarray(taps[f"blocks.{i}.attn.{src}"])  # (T_all, H, dh)
                out[step_key(k, f"blocks.{i}.attn.{tap}")] = np.ascontiguousarray(full[:n_pos].transpose(1, 0, 2))
        out[step_key(k, "logits")] = np.ascontiguousarray(np.asarray(taps["logits"])[n_pos - 1])  # (V,)
    return out


def greedy_prompts(
    weights: Mapping[str, np.ndarray], config: ModelConfig, named: Sequence[tuple[str, Sequence[int], str]],
    steps: int, run_with_taps: RunWithTaps | None = None,
) -> list[Prompt]:
    """Each prompt's greedy tokens by the float64 full forward, re-run on every prefix (the truth).

    FixtureError if the float32 full forward picks another token at any step (a near-tie: choose
    another prompt), so that one token list serves both tiers.
    """
    from parity_harness._fixture.fixture import Case
    from parity_reference.run import reference_taps

    prompts: list[Prompt] = []
    for name, tokens, text in named:
        seq = list(tokens)
        generated: list[int] = []
        for _ in range(steps + 1):
            taps = reference_taps(weights, config, [Case(name, tuple(seq))], "fp64",  # type: ignore[arg-type]
                                  run_with_taps)[name]
            generated.append(int(np.argmax(taps["logits"][-1])))
            seq.append(generated[-1])
        fp32 = reference_taps(weights, config, [Case(name, tuple(seq[:-1]))], "fp32",  # type: ignore[arg-type]
                              run_with_taps)[name]["logits"]
        for k in range(steps + 1):
            row = fp32[len(tokens) - 1 + k]
            if int(np.argmax(row)) != generated[k]:
                raise FixtureError(f"prompt {name!r}: float32 and float64 pick different greedy tokens at step {k} "
                                   f"(a near-tie, top-2 margin {top2_margin(row):.1e}); choose another prompt")
        prompts.append(Prompt(name, tuple(tokens), text, tuple(generated)))
    return prompts


def write_decoding_files(
    root: Path, weights: Mapping[str, np.ndarray], config: ModelConfig, vocab: Sequence[str],
    prompts: Sequence[tuple[str, str]] = DEFAULT_PROMPTS, steps: int = DEFAULT_STEPS, onnx: bool = True,
    progress: Callable[[str], None] | None = None, family: str = "gpt2",
) -> tuple[dict[str, Any], dict[str, str]]:
    """Write the decoding goldens (and the decoder-with-past ONNX graph) into `root`.

    Returns the manifest's `decoding` section and `files.decoding`. Needs torch (the reference).
    `family`: whose reference computes them (`family_forward`).
    """
    from parity_harness._authoring.fixture_writer import save_tensors
    from parity_harness._fixture.fixture import Case
    from parity_harness._fixture.platforms import current_platform
    from parity_reference.run import reference_taps

    say = progress or (lambda _message: None)
    named = [(name, encode_words(text, vocab), text) for name, text in prompts]
    for name, tokens, _ in named:
        if len(tokens) + steps > config.n_ctx:
            raise ParityError(f"prompt {name!r}: {len(tokens)} tokens + {steps} steps exceed the context "
                              f"({config.n_ctx})")
    say(f"greedy tokens of {len(named)} decoding prompts, {steps} steps")
    run_with_taps, key_tap = family_forward(family)
    found = greedy_prompts(weights, config, named, steps, run_with_taps)
    files: dict[str, str] = {}
    for precision in TIERS:
        say(f"decoding goldens {precision}")
        tensors: dict[str, np.ndarray] = {}
        for p in found:
            seq = (*p.tokens, *p.generated[:steps])
            taps = reference_taps(weights, config, [Case(p.name, seq)], precision,  # type: ignore[arg-type]
                                  run_with_taps)[p.name]
            for key, value in golden_from_forward(taps, config.n_layer, len(p.tokens), steps, key_tap).items():
                tensors[f"{p.name}/{key}"] = np.ascontiguousarray(value, dtype=DTYPES[precision])
        save_tensors(tensors, root / GOLDEN_FILES[precision])
        files[precision] = GOLDEN_FILES[precision]
    if onnx:
        from parity_harness._authoring.onnx_export import export_decode_onnx

        say(f"ONNX graph {ONNX_FILE}")
        export_decode_onnx(dict(weights), config, root / ONNX_FILE)
        files["onnx"] = ONNX_FILE
    section = {
        "steps": steps,
        "cache_layout": list(CACHE_LAYOUT),
        "taps": decode_tap_names(config.n_layer),
        "prompts": [{"name": p.name, "tokens": list(p.tokens), "text": p.text, "generated": list(p.generated),
                     "generated_text": " ".join(vocab[t] for t in p.generated)} for p in found],
        "platform": current_platform(),
    }
    return section, files


def add_decoding(root: Path, progress: Callable[[str], None] | None = None) -> None:
    """Add (or rewrite) the decoding goldens and graph of an existing toy fixture; no other file changes.

    The fixture is copied beside itself, the decoding files and the manifest's `decoding` section,
    `files.decoding` and sha256 entries are written into the copy, the copy is loaded and checked,
    and only then swapped in (parity_harness/_core/safe_write.py). `root` must be a fixture `parity export` made
    holding only its own files (`owned_entries`), so nothing parity did not write is touched.
    """
    from parity_harness._authoring.fixture_writer import copy_file, owned_entries
    from parity_harness._core.safe_write import replace_directory, staging_directory
    from parity_harness._fixture.fixture import load_fixture

    fixture = load_fixture(root)
    owned = owned_entries(root, "toy")
    weights = fixture.weights()
    with staging_directory(root) as staging:
        for name in sorted(owned):
            copy_file(root / name, staging / name)
        section, files = write_decoding_files(staging, weights, fixture.config, fixture.vocab, progress=progress)
        extend_manifest(staging, section, files)
        load_fixture(staging).decoding()  # validate what was written before replacing anything
        replace_directory(staging, root, owned)


def extend_manifest(root: Path, section: Mapping[str, Any], files: Mapping[str, str], key: str = "decoding") -> None:
    """Add the `key` section (`decoding`, or `training`: _authoring/training_writer.py), `files.{key}` and the
    files' sha256 to the manifest in `root`, and re-seal it.

    The new manifest is checked as a fixture (schema, hashes) before it replaces the old one,
    atomically (parity_harness/_core/safe_write.py).
    """
    from parity_harness._core.safe_write import write_text_atomic
    from parity_harness._core.strict_json import loads_strict
    from parity_harness._fixture.fixture import MANIFEST, fixture_from_manifest, read_manifest, sha256_file
    from parity_harness._fixture.schema import SEAL_KEY, manifest_digest

    manifest = read_manifest(root / MANIFEST)
    manifest[key] = dict(section)
    manifest["files"][key] = dict(files)
    for name in files.values():
        manifest["sha256"][name] = sha256_file(root / name)
    manifest[SEAL_KEY] = manifest_digest(manifest)
    text = json.dumps(manifest, indent=1) + "\n"
    fixture_from_manifest(root, loads_strict(text))
    write_text_atomic(root / MANIFEST, text, "manifest")
