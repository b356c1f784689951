"""Time what users wait for: training the toy, each backend's run on the fixture, and GPT-2 small.

Prints numbers only; performance targets live here, not in timed tests that flake. Run with
`nox -s bench` or `python -m benchmarks.bench [--repeat N] [--skip-training] [--fixture DIR]`.
The acceptance target for training (both models, 4,000 steps each) is under 60 s on 2 cores.

`python -m benchmarks.bench --preset gpt2-small [--keep DIR]` (`nox -s bench -- --preset gpt2-small`):
exports the preset into a temporary directory (its wall time and peak memory), then runs `parity run`
on it once per backend and once over all of them, each in a fresh process tree, and prints the wall
time and the peak RSS of the whole tree (benchmarks/treemem.py; docs/performance.md has the table).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from parity_harness._authoring.presets import SCALED_C
from parity_harness._backends.registry import backend_entry_points, load_backend
from parity_harness._fixture.fixture import default_fixture_dir, load_fixture


def bench_backends(fixture_dir: str, repeat: int) -> None:
    fixture = load_fixture(fixture_dir)
    fixture.weights()
    print(f"backend runs on {fixture_dir} ({len(fixture.cases)} cases), {repeat} repeats after one warm-up:")
    print(f"{'backend':<22} {'precision':<9} {'first (s)':>10} {'median (s)':>11} {'min (s)':>9}")
    for name in sorted(backend_entry_points(), key=lambda n: (n != "pytorch", n)):
        backend = load_backend(name)
        if backend.missing():
            print(f"{name:<22} skipped: needs {', '.join(backend.missing())}")
            continue
        for precision in backend.precisions:
            start = time.perf_counter()
            backend.outputs(fixture, precision)  # the first run pays imports and process start-up
            first = time.perf_counter() - start
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                backend.outputs(fixture, precision)
                times.append(time.perf_counter() - start)
            print(f"{name:<22} {precision:<9} {first:>10.3f} {statistics.median(times):>11.3f} {min(times):>9.3f}")


def bench_training() -> None:
    from parity_reference.train_tiny import run_experiment

    start = time.perf_counter()
    results, _ = run_experiment(progress=False)
    wall = time.perf_counter() - start
    print(f"training: masked model and unmasked twin, 4,000 steps each: {wall:.1f} s wall "
          f"({results['train_seconds']:.1f} s training; target < 60 s)")


SCALED_BACKENDS = ("pytorch", "numpy", "onnxruntime", "onnxruntime-optimized", "typescript", "hf-transformers")
TARGETS = "targets: export <= 120 s; all five backends <= 90 s wall and <= 3 GB peak RSS; typescript <= 45 s"


def bench_preset(preset: str, keep: str | None) -> int:
    """Export `preset`, then `parity run` per backend and over all of them, each measured as a process tree."""
    from benchmarks.treemem import measure

    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=f"parity-{preset}-")) / "fixture"
    try:
        cli = [sys.executable, "-m", "parity_harness"]
        rows: list[tuple[str, float, float, str]] = []
        if not (root / "manifest.json").is_file():
            m = measure([*cli, "export", "--preset", preset, "--fixture", str(root)])
            if m.returncode != 0:
                print(m.output)
                return m.returncode
            rows.append((f"export --preset {preset}", m.wall, m.peak_mb, "written: " + _size(root)))
        report = root.parent / f"{root.name}.report.json"
        for name in (*SCALED_BACKENDS, ",".join(SCALED_BACKENDS)):
            extra = ["--json", str(report)] if "," in name else []
            m = measure([*cli, "run", "--fixture", str(root), "--backends", name, "--no-skip", *extra])
            ran = "; ".join(f"{ln.split()[1]} {ln.split()[-2]} s" for ln in m.output.splitlines() if " ran in " in ln)
            verdict = next((ln.split(":")[0] for ln in m.output.splitlines() if ln.startswith(("PASS", "FAIL"))),
                           f"exit {m.returncode}")
            label = "all: " + ", ".join(SCALED_BACKENDS) if "," in name else name
            rows.append((label, m.wall, m.peak_mb, f"{verdict} (exit {m.returncode}); backend time: {ran}"))
        print(f"GPT-2-shaped preset {preset}, fixture in a temporary directory; {TARGETS}")
        print(f"| {'what':<40} | {'wall (s)':>8} | {'peak RSS (MB)':>13} | notes |")
        print(f"|{'-' * 42}|{'-' * 10}|{'-' * 15}|---|")
        for label, wall, peak, note in rows:
            print(f"| {label:<40} | {wall:>8.1f} | {peak:>13.0f} | {note} |")
        if report.is_file():  # what c of the per-tap rule the run used (docs/tolerances.md)
            from benchmarks.tolerance_units import main as units

            print("\nerrors of the run over all backends, in eps * M_tap units (c = "
                  f"{SCALED_C['fp32']:g} fp32, {SCALED_C['fp64']:g} fp64):")
            units([str(report), "--fixture", str(root)])
            report.unlink()
    finally:
        if not keep:
            shutil.rmtree(root.parent, ignore_errors=True)
    return 0


def _size(root: Path) -> str:
    return f"{sum(p.stat().st_size for p in root.iterdir()) / 1e6:,.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.bench", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--fixture", default=str(default_fixture_dir()))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--preset", help="benchmark a GPT-2-shaped preset instead (gpt2-small, gpt2-mini)")
    parser.add_argument("--keep", metavar="DIR", help="with --preset: export into DIR (or reuse it) and keep it")
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if args.preset:
        return bench_preset(args.preset, args.keep)
    bench_backends(args.fixture, args.repeat)
    if not args.skip_training:
        bench_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
