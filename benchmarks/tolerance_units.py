"""Measure c of the per-tap rule atol = c * eps * M_tap: every compared tap of a run, in eps * M_tap units.

`python -m benchmarks.tolerance_units REPORT.json --fixture DIR`: REPORT.json is `parity run --json`
on a scaled fixture (parity_harness/_authoring/presets.py). For each golden tier it prints the worst `max_abs /
(eps_tier * M_tap)` per backend x precision (M_tap = max |golden| of the tap over the cases, in
that tier's golden), and the taps where the worst ones happen: the table of docs/tolerances.md. With
`--per-tap`, a Markdown table instead: one row per kind of tap (`blocks.N.` folded into `blocks.*.`), one
column per backend x precision, the worst units against the fp64 golden (fp32 results: the fp32 one). An fp16
or bf16 result is counted in its own eps (2^-10, 2^-7) at the fp32 golden's M_tap, in both tiers: the rule
it is judged by (docs/tolerances.md, "Reduced precision"). Works on any fixture (the toy, the stress one).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from parity_harness._core.precision import EPS, is_reduced
from parity_harness._fixture.fixture import load_fixture
from parity_harness._fixture.tolerances import tap_magnitude


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.tolerance_units", description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--fixture", required=True)
    parser.add_argument("--top", type=int, default=3, help="worst taps listed per row")
    parser.add_argument("--per-tap", action="store_true", help="a Markdown table: tap kinds x backend-precision")
    args = parser.parse_args(argv)
    fixture = load_fixture(args.fixture)
    magnitude = {tier: {tap: tap_magnitude(fixture.golden_case(tier, c.name)[tap] for c in fixture.cases)  # type: ignore[arg-type]
                        for tap in fixture.tap_names} for tier in ("fp32", "fp64")}
    with open(args.report, encoding="utf-8") as f:
        report = json.load(f)
    rows: dict[tuple[str, str, str], list[tuple[float, str]]] = {}
    for t in report["taps"]:
        if t.get("max_abs") is None or t["status"] == "not_supported":
            continue
        tier = t["golden"]
        reduced = is_reduced(t["precision"])
        m = magnitude["fp32" if reduced else tier][t["tap"]]
        eps = EPS[t["precision"] if reduced else tier]
        units = t["max_abs"] / (eps * m) if m else 0.0
        rows.setdefault((t["backend"], t["precision"], tier), []).append((units, t["tap"]))
    if args.per_tap:
        print_per_tap(rows, fixture.tap_names)
        return 0
    print(f"{'backend':<22} {'result':<6} {'golden':<6} {'worst units':>11}  worst taps")
    for (backend, precision, tier), units in rows.items():
        units.sort(reverse=True)
        top = ", ".join(f"{tap} {u:.2g}" for u, tap in units[: args.top])
        print(f"{backend:<22} {precision:<6} {tier:<6} {units[0][0]:>11.3g}  {top}")
    return 0


def print_per_tap(rows: dict[tuple[str, str, str], list[tuple[float, str]]], taps: list[str]) -> None:
    """The worst units per kind of tap (blocks folded), one column per backend x precision, as Markdown."""
    columns = [(b, p, tier) for (b, p, tier) in rows if tier == ("fp32" if p == "fp32" else "fp64")]
    kinds = list(dict.fromkeys(re.sub(r"^blocks\.\d+\.", "blocks.*.", t) for t in taps))
    worst = {col: {} for col in columns}  # type: dict[tuple[str, str, str], dict[str, float]]
    for col in columns:
        for units, tap in rows[col]:
            kind = re.sub(r"^blocks\.\d+\.", "blocks.*.", tap)
            worst[col][kind] = max(worst[col].get(kind, 0.0), units)
    print("| tap | " + " | ".join(f"{b} {p}" for b, p, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for kind in kinds:
        cells = [f"{worst[col][kind]:.3g}" if kind in worst[col] else "-" for col in columns]
        print(f"| `{kind}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
