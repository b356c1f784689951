"""Compare two `parity run --json` reports field by field, ignoring timings: a behaviour check across commits.

    python benchmarks/report_diff.py BEFORE.json AFTER.json

Prints every difference as a JSON path (`results[pytorch/fp32/fp32/grammar_0/logits].max_abs: 1e-07 -> 2e-07`;
rows of a report's lists are matched by the backend, precision, tier, case, tap and step they name), then what only
one side has: added or removed keys (list indices folded to `[]`) and rows of backends only one side ran. Timings
(`seconds` anywhere) are not
compared. Exit 0 when the only differences are added fields, 1 when a value changed or a field went missing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

IGNORED_KEYS = {"seconds"}
# The fields that name a row of a report list: rows are matched by them, not by position, so a backend added
# between two commits shows as added rows, not as every later row changed.
ROW_KEYS = ("backend", "precision", "golden", "prompt", "case", "tap", "step")


def row_key(row: Any) -> tuple[Any, ...] | None:
    if isinstance(row, dict) and "backend" in row:
        return tuple(row.get(k) for k in ROW_KEYS)
    return None


def walk(a: Any, b: Any, path: str, changed: list[str], added: set[str], removed: set[str]) -> None:
    """Record every differing value under `path`; keys present on one side only go to added/removed."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key in IGNORED_KEYS:
                continue
            where = f"{path}.{key}" if path else key
            if key not in a:
                added.add(re.sub(r"\[\d+\]", "[]", where))
            elif key not in b:
                removed.add(re.sub(r"\[\d+\]", "[]", where))
            else:
                walk(a[key], b[key], where, changed, added, removed)
    elif isinstance(a, list) and isinstance(b, list):
        maybe_a, maybe_b = [row_key(x) for x in a], [row_key(y) for y in b]
        keys_a = [k for k in maybe_a if k is not None]
        keys_b = [k for k in maybe_b if k is not None]
        if a and b and len(keys_a) == len(a) and len(keys_b) == len(b):  # report rows: match by what they name
            by_b = dict(zip(keys_b, b, strict=True))
            for key, x in zip(keys_a, a, strict=True):
                label = f"{path}[{'/'.join(str(k) for k in key if k is not None)}]"
                if key in by_b:
                    walk(x, by_b[key], label, changed, added, removed)
                else:
                    removed.add(f"{path}[] row of {key[0]}")
            for key in set(keys_b) - set(keys_a):
                added.add(f"{path}[] rows of {key[0]}")
            return
        if len(a) != len(b):
            changed.append(f"{path}: {len(a)} items -> {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            walk(x, y, f"{path}[{i}]", changed, added, removed)
    elif a != b or type(a) is not type(b):
        changed.append(f"{path}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    before, after = (json.loads(Path(p).read_text(encoding="utf-8")) for p in argv)
    changed: list[str] = []
    added: set[str] = set()
    removed: set[str] = set()
    walk(before, after, "", changed, added, removed)
    for line in changed:
        print(f"changed  {line}")
    for line in sorted(removed):
        print(f"removed  {line}")
    for line in sorted(added):
        print(f"added    {line}")
    print(f"{len(changed)} changed, {len(removed)} removed, {len(added)} added (timings ignored)")
    return 1 if changed or removed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
