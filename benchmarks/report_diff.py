"""Compare two `parity run --json` reports field by field, ignoring timings: a behaviour check across commits.

    python benchmarks/report_diff.py BEFORE.json AFTER.json

Prints every difference as a JSON path (`results[12].max_abs: 1e-07 -> 2e-07`), then the fields only one side
has (added or removed keys, by path with list indices folded to `[]`). Timings (`seconds` anywhere) are not
compared. Exit 0 when the only differences are added fields, 1 when a value changed or a field went missing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

IGNORED_KEYS = {"seconds"}


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
