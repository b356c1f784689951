"""`parity export`: train the toy, write the fixture; `parity export --check`: prove it reproducible.

The fixture is data only: manifest.json, float32 weights, float32 and float64 golden taps
(safetensors), and the two ONNX graphs. `--check` regenerates everything into a temporary
directory and compares with what is committed:
- golden files recomputed from the committed weights must agree bit for bit;
- retrained weights must be bit-identical on the platform that made them; on another platform
  (CPU kernels differ) training is chaotic (a 1-ulp change of the initial weights moves the final
  weights by ~1), so there the retrained model's held-out loss must agree within RETRAIN_LOSS_RTOL
  (see docs/fixtures.md);
- the manifest must be identical apart from the hashes;
- the committed ONNX graphs must reproduce the golden files (ONNX bytes are not reproducible).
"""

from __future__ import annotations

import json
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import EXIT_DISAGREE, EXIT_OK, FixtureError
from harness.fixture import MANIFEST, Case, load_fixture, read_safetensors

FP32_ATOL = 1e-5  # the lesson's gate, see docs/tolerances.md
FP32_RTOL = 1e-5  # float32 round-off grows with the magnitude (4 ulp at 27.6 measured), docs/tolerances.md
FP64_ATOL = 1e-12  # measured float64 round-off budget, see docs/tolerances.md
RETRAIN_LOSS_RTOL = 0.01  # on another platform: held-out loss of retrained vs committed weights, docs/fixtures.md
SEED = 0
STEPS = 4000
CASE_SEED = 20261130  # random cases

Progress = Callable[[str], None]


def current_platform() -> dict[str, str]:
    """What decides whether training is bit-reproducible: architecture, torch, its CPU kernels."""
    import torch

    return {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
    }


def make_cases(vocab_size: int, n_ctx: int, seed: int = SEED) -> list[dict[str, Any]]:
    """At least 10 cases chosen to find bugs, each with its reason in `kind`."""
    from reference.grammar import VOCAB, decode
    from reference.train_tiny import heldout_sentences

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


def write_fixture(root: Path, weights: dict[str, np.ndarray], seed: int, steps: int, with_onnx: bool,
                  progress: Progress) -> None:
    """Write a complete fixture for `weights` (float32, HF names) into `root`."""
    import torch

    from harness.backends.pytorch_backend import reference_taps
    from harness.fixture_writer import write_fixture_files
    from reference.config import TOY
    from reference.grammar import VOCAB

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
            "weights": "reference.train_tiny.train(TOY, seed, steps); golden: reference.model.run_with_taps",
            "platform": current_platform(),
        },
        progress=lambda message: progress(f"parity export: {message}"),
    )


def train_weights(seed: int, steps: int, progress: Progress) -> dict[str, np.ndarray]:
    from reference.config import TOY
    from reference.train_tiny import train

    progress(f"parity export: training the toy for {steps} steps (seed {seed})")
    model = train(TOY, seed=seed, steps=steps, progress=True)
    return {k: v.detach().to("cpu").float().numpy().copy() for k, v in model.params().items()}


def export_fixture(root: Path, steps: int = STEPS, seed: int = SEED, progress: Progress = print) -> None:
    """Retrain and rewrite the fixture at `root` (atomically: written beside it, then swapped in)."""
    start = time.perf_counter()
    weights = train_weights(seed, steps, progress)
    with tempfile.TemporaryDirectory(dir=root.parent if root.parent.exists() else None) as tmp:
        staging = Path(tmp) / "fixture"
        write_fixture(staging, weights, seed, steps, with_onnx=True, progress=progress)
        load_fixture(staging)  # validate what was written before replacing anything
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(staging, root)
    for path in root.iterdir():
        path.chmod(0o644)  # temporary files are created private; the fixture is meant to be shared
    progress(f"parity export: wrote {root} in {time.perf_counter() - start:.1f} s")


def _manifest_without_hashes(path: Path) -> dict[str, Any]:
    """The manifest apart from hashes and the (informational) platform that made it."""
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest.pop("sha256", None)
    manifest.pop("manifest_sha256", None)  # the seal hashes the rest, hashes included
    manifest.get("provenance", {}).pop("platform", None)
    return manifest  # type: ignore[no-any-return]


def heldout_loss(weights: dict[str, np.ndarray]) -> float:
    """The masked model's mean NLL per predicted word on the held-out sentences of train_tiny."""
    import torch

    from reference.config import TOY
    from reference.model import GPT
    from reference.train_tiny import evaluate, heldout_sentences

    model = GPT(TOY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    return evaluate(model, heldout_sentences())


def check_fixture(root: Path, progress: Progress = print) -> int:
    """Regenerate into a temporary directory and compare with the committed fixture at `root`."""
    fixture = load_fixture(root)
    committed_weights = fixture.weights()
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        regen = Path(tmp)
        # 1. golden files from the committed weights: bit for bit.
        seed = int(fixture.manifest["provenance"]["seed"])
        steps = int(fixture.manifest["provenance"]["steps"])
        write_fixture(regen, committed_weights, seed, steps, with_onnx=False, progress=progress)
        for precision in ("fp32", "fp64"):
            ours = read_safetensors(regen / f"golden.{precision}.safetensors")
            theirs = read_safetensors(fixture.golden_path(precision))
            if set(ours) != set(theirs):
                problems.append(f"golden {precision}: keys differ ({len(set(ours) ^ set(theirs))} keys)")
                continue
            differ = [k for k in ours if not np.array_equal(ours[k], theirs[k], equal_nan=True)]
            status = "bit-identical" if not differ else f"{len(differ)} tensors differ, e.g. {differ[0]!r}"
            progress(f"parity export --check: golden {precision} recomputed from the committed weights: {status}")
            if differ:
                problems.append(f"golden {precision}: {status}")
        # 2. the manifest, apart from hashes (and the ONNX entries, which this regeneration skips).
        ours_m, theirs_m = _manifest_without_hashes(regen / MANIFEST), _manifest_without_hashes(fixture.manifest_path)
        theirs_m["files"].pop("onnx", None)
        if ours_m != theirs_m:
            keys = sorted(k for k in set(ours_m) | set(theirs_m) if ours_m.get(k) != theirs_m.get(k))
            problems.append(f"manifest differs apart from hashes in: {', '.join(keys)}")
        else:
            progress("parity export --check: manifest identical apart from hashes")
        # 3. retrained weights: bit-identical on the same platform, the same quality on another.
        retrained = train_weights(seed, steps, progress)
        worst = max(float(np.abs(retrained[k] - committed_weights[k]).max()) for k in committed_weights)
        same_platform = fixture.manifest["provenance"].get("platform") == current_platform()
        if worst == 0.0:
            progress("parity export --check: retrained weights vs committed: bit-identical")
        elif same_platform:
            problems.append(f"retrained weights differ by up to {worst:.2e} on the platform that made them "
                            "(training should be bit-reproducible here)")
        else:
            loss_new, loss_old = heldout_loss(retrained), heldout_loss(committed_weights)
            rel = abs(loss_new - loss_old) / loss_old
            progress(f"parity export --check: another platform ({current_platform()}); retrained weights differ "
                     f"by up to {worst:.2e}, held-out loss {loss_new:.4f} vs committed {loss_old:.4f} "
                     f"(relative {rel:.1e}, limit {RETRAIN_LOSS_RTOL:g})")
            if rel > RETRAIN_LOSS_RTOL:
                problems.append(f"retrained model's held-out loss {loss_new:.4f} is not within "
                                f"{RETRAIN_LOSS_RTOL:.0%} of the committed model's {loss_old:.4f}")
    # 4. the committed ONNX graphs against the golden files.
    if fixture.onnx_path("all_taps") is not None:
        from harness.onnx_export import check_onnx_against_golden

        for line in check_onnx_against_golden(fixture):
            progress(f"parity export --check: {line}")
    else:
        problems.append("the fixture lists no ONNX graphs; run `parity export`")
    for p in problems:
        print(f"parity export --check: FAIL: {p}")
    if problems:
        print("parity export --check: the committed fixture is stale; regenerate it with `nox -s fixtures`")
        return EXIT_DISAGREE
    print("parity export --check: OK, the committed fixture is reproducible")
    return EXIT_OK


__all__ = ["FixtureError", "check_fixture", "export_fixture", "make_cases", "write_fixture"]
