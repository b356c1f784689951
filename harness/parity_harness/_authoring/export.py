"""`parity export`: train the toy, write the fixture; `parity export --check`: prove it reproducible.

The fixture is data only: manifest.json, float32 weights, float32 and float64 golden taps
(safetensors), and the two ONNX graphs. `--check` regenerates everything into a temporary
directory and compares with what is committed (what a "platform" is: parity_harness/_fixture/platforms.py):
- golden files recomputed from the committed weights must agree bit for bit on the platform that
  made them (`provenance.platform`), and by the measured cross-platform rule on any other;
- retrained weights must be bit-identical on the platform that trained them
  (`provenance.training_platform`, else `provenance.platform`); on another platform training is
  chaotic (a 1-ulp change of the initial weights moves the final weights by ~1), so there the
  retrained model's held-out loss must agree within RETRAIN_LOSS_RTOL (see docs/fixtures.md);
- the manifest must be identical apart from the hashes;
- the committed ONNX graphs must reproduce the golden files (ONNX bytes are not reproducible).
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._compare.judge import compare_tensors
from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import TIERS, Precision
from parity_harness._core.status import Verdict
from parity_harness._core.text import num_text
from parity_harness._fixture.decoding import decoding_table
from parity_harness._fixture.files import open_checked, read_checked
from parity_harness._fixture.fixture import MANIFEST, Case, Fixture, load_fixture
from parity_harness._fixture.platforms import (
    CROSS_PLATFORM_RULE,
    current_platform,
    describe,
    fp64_cross_platform_atol,
    same_platform,
    training_platform,
)
from parity_reference.tensor_check import DECODING_GOLDEN, GOLDEN

RETRAIN_LOSS_RTOL = 0.01  # on another platform: held-out loss of retrained vs committed weights, docs/fixtures.md
SEED = 0
STEPS = 4000
CASE_SEED = 20261130  # random cases

if TYPE_CHECKING:
    from parity_harness._backends.onnx.graph import OnnxGraph

Progress = Callable[[str], None]


def make_cases(vocab_size: int, n_ctx: int, seed: int = SEED) -> list[dict[str, Any]]:
    """At least 10 cases chosen to find bugs, each with its reason in `kind`."""
    from parity_reference.grammar import VOCAB, decode
    from parity_reference.train_tiny import heldout_sentences

    cases: list[dict[str, Any]] = []
    held = heldout_sentences(400, seed)
    # Held-out grammar sentences: the shortest, a medium one and the longest, with the start marker.
    by_len = sorted(held, key=len)
    for i, sent in enumerate([by_len[0], by_len[len(by_len) // 2], by_len[-1], held[0]]):
        cases.append({"name": f"grammar_{i}", "kind": "grammar", "tokens": [0, *sent][:n_ctx]})
    rng = random.Random(CASE_SEED)
    for i, length in enumerate((7, n_ctx - 3)):
        cases.append({"name": f"random_{i}", "kind": "random",
                      "tokens": [rng.randrange(vocab_size) for _ in range(length)]})
    cases.append({"name": "single_token", "kind": "single", "tokens": [VOCAB.index("the")]})
    stream: list[int] = [0]
    for sent in held:
        stream += sent
        if len(stream) >= n_ctx:
            break
    cases.append({"name": "longest_context", "kind": "longest", "tokens": stream[:n_ctx]})
    cases.append({"name": "repeated_token", "kind": "repeated", "tokens": [VOCAB.index("cat")] * 10})
    cases.append({"name": "all_words", "kind": "all_words", "tokens": list(range(vocab_size))})
    cases.append({"name": "all_words_reversed", "kind": "all_words", "tokens": list(range(vocab_size))[::-1]})
    cases.append({"name": "end_markers", "kind": "repeated", "tokens": [0] * 5})
    for c in cases:
        c["text"] = decode(c["tokens"])
    return cases


def write_fixture(root: Path, weights: dict[str, np.ndarray], seed: int, steps: int,
                  with_onnx: bool | Mapping[OnnxGraph, Path], progress: Progress,
                  decode_onnx: Path | None = None) -> None:
    """Write a complete fixture for `weights` (float32, HF names) into `root`, decoding goldens included.

    `with_onnx`: export both graphs (True), none (False), or copy existing files {kind: path}; the
    decoder-with-past graph is exported with True, else copied from `decode_onnx` when given.
    The goldens are computed here: `provenance.platform` records this platform. A fixture whose
    goldens were recomputed away from where its weights were trained may say so by hand in
    `provenance.training_platform`, which `check_fixture` reads.
    """
    import torch

    from parity_harness._authoring.fixture_writer import write_fixture_files
    from parity_reference.config import TOY
    from parity_reference.grammar import VOCAB
    from parity_reference.run import reference_taps

    config = TOY
    cases = [Case(c["name"], tuple(c["tokens"]), c["kind"], c["text"])
             for c in make_cases(config.vocab_size, config.n_ctx, seed)]
    write_fixture_files(
        root,
        config=config,
        vocab=VOCAB,
        cases=cases,
        weights=weights,
        golden=lambda precision: reference_taps(weights, config, cases, precision),
        onnx=with_onnx,
        provenance={
            "torch": torch.__version__.split("+")[0],
            "seed": seed,
            "steps": steps,
            "command": "parity export",
            # The module names the committed fixture was made with (before parity_reference): provenance is data,
            # and `parity export --check` compares it.
            "weights": "reference.train_tiny.train(TOY, seed, steps); golden: reference.model.run_with_taps",
            "platform": current_platform(),
        },
        progress=lambda message: progress(f"parity export: {message}"),
    )
    from parity_harness._authoring.decoding_writer import extend_manifest, write_decoding_files
    from parity_harness._fixture.decoding import ONNX_FILE

    section, files = write_decoding_files(root, weights, config, VOCAB, onnx=with_onnx is True,
                                          progress=lambda message: progress(f"parity export: {message}"))
    if decode_onnx is not None and with_onnx is not True:
        from parity_harness._authoring.fixture_writer import copy_file

        copy_file(decode_onnx, root / ONNX_FILE)
        files["onnx"] = ONNX_FILE
    extend_manifest(root, section, files)
    from parity_harness._authoring.training_writer import add_training, training_cases
    from parity_reference.backward import lesson_spec

    add_training(root, weights, config, cases, lesson_spec(training_cases(cases)),
                 progress=lambda message: progress(f"parity export: {message}"))


def train_weights(seed: int, steps: int, progress: Progress) -> dict[str, np.ndarray]:
    from parity_reference.config import TOY
    from parity_reference.train_tiny import train

    progress(f"parity export: training the toy for {steps} steps (seed {seed})")
    model = train(TOY, seed=seed, steps=steps, progress=True)
    return {k: v.detach().to("cpu").float().numpy().copy() for k, v in model.params().items()}


def export_fixture(root: Path, steps: int = STEPS, seed: int = SEED, progress: Progress = print) -> None:
    """Retrain and rewrite the toy fixture at `root`, atomically: written beside it, checked, then swapped in.

    `root` must be new, empty, or a toy fixture holding only its own files (`owned_entries`): it
    is checked before training, and again before the swap.
    """
    from parity_harness._authoring.fixture_writer import owned_entries
    from parity_harness._core.safe_write import replace_directory, staging_directory

    start = time.perf_counter()
    owned_entries(root, "toy")  # refused before 50 s of training, not after
    weights = train_weights(seed, steps, progress)
    with staging_directory(root) as staging:
        write_fixture(staging, weights, seed, steps, with_onnx=True, progress=progress)
        load_fixture(staging)  # validate what was written before replacing anything
        replace_directory(staging, root, owned_entries(root, "toy"))
    progress(f"parity export: wrote {root} in {time.perf_counter() - start:.1f} s")


def _manifest_without_hashes(path: Path) -> dict[str, Any]:
    """The manifest apart from hashes and the platforms that made it (compared by their own rules)."""
    from parity_harness._fixture.fixture import read_manifest

    manifest = read_manifest(path)
    manifest.pop("sha256", None)
    manifest.pop("manifest_sha256", None)  # the seal hashes the rest, hashes included
    manifest.get("provenance", {}).pop("platform", None)
    manifest.get("provenance", {}).pop("training_platform", None)
    if isinstance(manifest.get("decoding"), dict):
        manifest["decoding"].pop("platform", None)  # compared by its own rule (check_goldens)
    if isinstance(manifest.get("training"), dict):  # compared by their own rule (check_training_goldens)
        manifest["training"].pop("platform", None)
        manifest["training"].pop("units", None)
    return manifest  # type: ignore[no-any-return]


def heldout_loss(weights: dict[str, np.ndarray]) -> float:
    """The masked model's mean NLL per predicted word on the held-out sentences of train_tiny."""
    import torch

    from parity_reference.config import TOY
    from parity_reference.model import GPT
    from parity_reference.train_tiny import evaluate, heldout_sentences

    model = GPT(TOY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[name].copy()))  # fixture arrays are read-only
    return evaluate(model, heldout_sentences())


def _provenance_int(fixture: Fixture, key: str) -> int:
    value = fixture.manifest.get("provenance", {}).get(key) if isinstance(fixture.manifest.get("provenance"), dict) \
        else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FixtureError(f"{fixture.manifest_path}: provenance.{key} must be a non-negative integer, got {value!r}")
    return value


def check_goldens(fixture: Fixture, regen: Path, bit_identical: bool, say: Progress) -> list[str]:
    """Compare the goldens recomputed into `regen` with the committed ones; the problems found.

    `bit_identical`: the same platform, every tensor must be equal bit for bit. Otherwise each
    tensor is judged by the cross-platform rule (parity_harness._fixture.platforms), through `compare_tensors`.
    """
    problems: list[str] = []
    pairs: list[tuple[Precision, Path, Path, bool]] = [
        (precision, regen / f"golden.{precision}.safetensors", fixture.golden_path(precision), bit_identical)
        for precision in TIERS
    ]
    decoding = fixture.files.get("decoding")
    if isinstance(decoding, dict) and fixture.decoding() is not None:
        # made on the platform recorded in the decoding section (they may be added later than the rest)
        made_on = fixture.manifest["decoding"].get("platform")
        same = same_platform(made_on, current_platform())
        say(f"decoding goldens made on: {describe(made_on)}; rule: "
            f"{'bit-identical' if same else 'cross-platform'}")
        pairs += [(precision, regen / str(decoding[precision]), fixture.root / str(decoding[precision]), same)
                  for precision in TIERS]
    for precision, ours_path, theirs_path, bit_identical in pairs:
        decode = "decode" in theirs_path.name
        label = precision if not decode else f"decoding {precision}"
        table = decoding_table(fixture, precision) if decode else fixture.golden_table(precision)
        kind = DECODING_GOLDEN if decode else GOLDEN
        theirs = open_checked(theirs_path, table, kind)  # the committed file: a broken one is an error
        try:
            ours = open_checked(ours_path, table, kind)
        except FixtureError as exc:  # the recomputed file: its tensors not the fixture's is a failed check
            problems.append(f"golden {label}: the recomputed file does not hold the fixture's tensors ({exc})")
            continue
        # One pair of tensors at a time (a GPT-2-sized golden is never all in memory), each file's values
        # checked as it is read (no NaN).
        differ: list[str] = []
        worst_key, worst_abs, worst_allowed, breaking = "", -1.0, 0.0, []
        for (key, mine), (_, committed) in zip(read_checked(ours, table, kind), read_checked(theirs, table, kind),
                                              strict=True):
            if np.array_equal(mine, committed):
                continue
            differ.append(key)
            if bit_identical:
                continue
            tap = key.split("/", 1)[1]
            if precision == "fp32":
                tol = fixture.tolerances["fp32"].for_tap(tap)
                atol, rtol = tol.atol, tol.rtol
            else:
                atol, rtol = fp64_cross_platform_atol(committed), 0.0
            cmp = compare_tensors(mine, committed, atol, rtol)
            allowed = atol + rtol * abs(cmp.expected or 0.0)
            if not cmp.passed:
                breaking.append(f"{key} ({cmp.message or f'|diff| {cmp.max_abs:.2e} > {allowed:.2e}'})")
            if cmp.max_abs > worst_abs:
                worst_key, worst_abs, worst_allowed = key, cmp.max_abs, allowed
        if bit_identical or not differ:
            status = "bit-identical" if not differ else f"{len(differ)} tensors differ, e.g. {differ[0]!r}"
            say(f"golden {label} recomputed from the committed weights: {status}")
            if differ:
                problems.append(f"golden {label}: {status}")
            continue
        status = (f"{len(differ)} of {len(table)} tensors differ, worst |diff| {worst_abs:.2e} at {worst_key!r} "
                  f"(allowed there {worst_allowed:.2e})")
        if breaking:
            problems.append(f"golden {label}: {len(breaking)} tensors break the cross-platform rule, "
                            f"e.g. {breaking[0]}")
            say(f"golden {label} recomputed from the committed weights: {status}: FAIL")
        else:
            say(f"golden {label} recomputed from the committed weights: {status}: within the cross-platform rule")
    return problems


def check_fixture(root: Path, progress: Progress = print, retrain: bool = True, out: Progress = print) -> Verdict:
    """Regenerate into a temporary directory and compare with the committed fixture at `root`.

    Golden files: bit for bit on the platform that made them, else by the cross-platform rule.
    Retrained weights (unless `retrain` is False): bit for bit on the platform that trained them,
    else the held-out loss within RETRAIN_LOSS_RTOL. Which rule applied goes to `progress`, the verdict to `out`.
    """
    fixture = load_fixture(root)
    if fixture.family != "gpt2":  # the toy's check retrains GPT-2; a Llama fixture has its own (presets.py)
        preset = fixture.manifest.get("provenance", {}).get("preset") if isinstance(
            fixture.manifest.get("provenance"), dict) else None
        raise FixtureError(f"{root}: a {fixture.family} fixture, not the toy"
                           + (f": pass --preset {preset}" if isinstance(preset, str) else ""))
    committed_weights = fixture.weights()
    seed, steps = _provenance_int(fixture, "seed"), _provenance_int(fixture, "steps")
    provenance = fixture.manifest["provenance"]
    here = current_platform()

    def say(message: str) -> None:
        progress(f"parity export --check: {message}")

    golden_same = same_platform(provenance.get("platform"), here)
    say(f"goldens made on: {describe(provenance.get('platform'))}")
    say(f"this platform:   {describe(here)}")
    if golden_same:
        say("rule for the golden files: bit-identical (this is the platform that made them)")
    else:
        say(f"rule for the golden files: cross-platform (made on another platform): {CROSS_PLATFORM_RULE}")
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        regen = Path(tmp)
        # 1. golden files from the committed weights.
        write_fixture(regen, committed_weights, seed, steps, with_onnx=False, progress=progress)
        problems += check_goldens(fixture, regen, golden_same, say)
        # 2. the manifest, apart from hashes and platforms (and the ONNX entries, which this regeneration skips).
        ours_m, theirs_m = _manifest_without_hashes(regen / MANIFEST), _manifest_without_hashes(fixture.manifest_path)
        theirs_m["files"].pop("onnx", None)
        if isinstance(theirs_m["files"].get("decoding"), dict):
            theirs_m["files"]["decoding"].pop("onnx", None)
        if "decoding" not in theirs_m:  # an older fixture without decoding goldens: nothing to compare
            ours_m.pop("decoding", None)
            ours_m["files"].pop("decoding", None)
            say("the fixture has no decoding goldens: not checked")
        if "training" not in theirs_m:  # a fixture without gradient goldens: nothing to compare
            ours_m.pop("training", None)
            ours_m["files"].pop("training", None)
        if ours_m != theirs_m:
            keys = sorted(k for k in set(ours_m) | set(theirs_m) if ours_m.get(k) != theirs_m.get(k))
            problems.append(f"manifest differs apart from hashes in: {', '.join(keys)}")
        else:
            say("manifest identical apart from hashes")
        if "training" in theirs_m:
            from parity_harness._authoring.training_writer import check_training_goldens

            problems += check_training_goldens(fixture, load_fixture(regen), say)
    # 3. retrained weights: bit-identical on the platform that trained them, the same quality on another.
    if retrain:
        problems += _check_retraining(committed_weights, seed, steps, training_platform(provenance), here, say)
    else:
        say("retraining skipped (--no-retrain): the weights were not checked")
    # 4. the committed ONNX graphs against the golden files.
    if fixture.onnx_path("all_taps") is not None:
        from parity_harness._authoring.onnx_export import check_onnx_against_golden

        for line in check_onnx_against_golden(fixture):
            say(line)
        problems += _check_decode_graph(fixture, say)
    else:
        problems.append("the fixture lists no ONNX graphs; run `parity export`")
    for p in problems:
        out(f"parity export --check: FAIL: {p}")
    if problems:
        out("parity export --check: the committed fixture is stale; regenerate it with `nox -s fixtures`")
        return Verdict.DISAGREE
    out("parity export --check: OK, the committed fixture is reproducible"
          + ("" if retrain else " (golden files, manifest and ONNX graphs; training not re-run)"))
    return Verdict.AGREE


def _check_decode_graph(fixture: Fixture, say: Progress) -> list[str]:
    """The committed decoder-with-past graph (onnxruntime) against the float32 decoding goldens."""
    from parity_harness._backends.onnx.decode import decode_graph, ort_decode
    from parity_harness._compare.decoding import compare_decoding
    from parity_harness._fixture.decoding import golden_decoding

    decoding, path = fixture.decoding(), decode_graph(fixture)
    if decoding is None or path is None:
        return []
    output = ort_decode(fixture, decoding.requests())
    checks = compare_decoding(fixture, "onnxruntime", "fp32", "fp32", output, golden_decoding(fixture, "fp32"))
    worst = max(checks, key=lambda c: c.max_abs if c.max_abs is not None else math.inf)
    say(f"{path.name}: {len(checks)} step x tap checks reproduce the decoding goldens fp32, "
        f"worst {worst.case} step {worst.step} {worst.tap} max |diff| {num_text(worst.max_abs)}")
    bad = [c for c in checks if not c.passed]
    return [f"{path.name} does not reproduce the decoding goldens ({len(bad)} checks, e.g. {bad[0].case} "
            f"step {bad[0].step} {bad[0].tap})"] if bad else []


def _check_retraining(committed: dict[str, np.ndarray], seed: int, steps: int, trained_on: object,
                      here: dict[str, str], say: Progress) -> list[str]:
    """Retrain with the fixture's seed and steps; compare with the committed weights by the rule that applies."""
    retrained = train_weights(seed, steps, lambda m: say(m.removeprefix("parity export: ")))
    worst = max(float(np.abs(retrained[k] - committed[k]).max()) for k in committed)
    if worst == 0.0:
        say("retrained weights vs committed: bit-identical")
        return []
    if same_platform(trained_on, here):
        say("rule for retraining: bit-identical weights (this is the platform that trained them)")
        return [f"retrained weights differ by up to {worst:.2e} on the platform that trained them "
                "(training should be bit-reproducible here)"]
    say(f"rule for retraining: held-out loss within {RETRAIN_LOSS_RTOL:.0%} (trained on another platform: "
        f"{describe(trained_on)})")
    loss_new, loss_old = heldout_loss(retrained), heldout_loss(committed)
    rel = abs(loss_new - loss_old) / loss_old
    say(f"retrained weights differ by up to {worst:.2e}; held-out loss {loss_new:.4f} vs committed {loss_old:.4f} "
        f"(relative {rel:.1e}, limit {RETRAIN_LOSS_RTOL:g})")
    if rel > RETRAIN_LOSS_RTOL:
        return [f"retrained model's held-out loss {loss_new:.4f} is not within "
                f"{RETRAIN_LOSS_RTOL:.0%} of the committed model's {loss_old:.4f}"]
    return []


__all__ = ["FixtureError", "check_fixture", "export_fixture", "make_cases", "write_fixture"]
