"""Time what users wait for: training the toy, and each backend's run on the fixture.

Prints numbers only; performance targets live here, not in timed tests that flake. Run with
`nox -s bench` or `python -m benchmarks.bench [--repeat N] [--skip-training] [--fixture DIR]`.
The acceptance target for training (both models, 4,000 steps each) is under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from harness.fixture import default_fixture_dir, load_fixture
from harness.registry import backend_entry_points, load_backend


def bench_backends(fixture_dir: str, repeat: int) -> None:
    fixture = load_fixture(fixture_dir)
    fixture.weights()
    print(f"backend runs on {fixture_dir} ({len(fixture.cases)} cases), {repeat} repeats after one warm-up:")
    print(f"{'backend':<22} {'precision':<9} {'first (s)':>10} {'median (s)':>11} {'min (s)':>9}")
    for name in sorted(backend_entry_points(), key=lambda n: (n != "pytorch", n)):
        backend = load_backend(name)
        if backend.missing_dependencies():
            print(f"{name:<22} skipped: needs {', '.join(backend.missing_dependencies())}")
            continue
        for precision in backend.precisions:
            start = time.perf_counter()
            backend.run(fixture, precision)  # the first run pays imports and process start-up
            first = time.perf_counter() - start
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                backend.run(fixture, precision)
                times.append(time.perf_counter() - start)
            print(f"{name:<22} {precision:<9} {first:>10.3f} {statistics.median(times):>11.3f} {min(times):>9.3f}")


def bench_training() -> None:
    from reference.train_tiny import run_experiment

    start = time.perf_counter()
    results, _ = run_experiment(progress=False)
    wall = time.perf_counter() - start
    print(f"training: masked model and unmasked twin, 4,000 steps each: {wall:.1f} s wall "
          f"({results['train_seconds']:.1f} s training; target < 60 s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.bench", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--fixture", default=str(default_fixture_dir()))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    bench_backends(args.fixture, args.repeat)
    if not args.skip_training:
        bench_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
