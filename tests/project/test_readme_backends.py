"""The README's table of built-in backends is true to the code: every built-in backend, and its precisions."""

from __future__ import annotations

import re
from pathlib import Path

from parity_harness._backends.base import Backend
from parity_harness._backends.registry import backend_entry_points

README = Path(__file__).resolve().parents[2] / "README.md"
BUILTIN = "parity_harness._backends."


def readme_backends(text: str) -> dict[str, str]:
    """{backend: its 'computes in' cell} from the table under 'Built-in backends:'."""
    table = text.split("Built-in backends:", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {m.group(1): m.group(2).strip() for line in rows if (m := re.match(r"\| `([^`]+)` \| ([^|]+) \|", line))}


def test_the_readme_lists_every_builtin_backend_with_its_precisions() -> None:
    listed = readme_backends(README.read_text(encoding="utf-8"))
    declared: dict[str, str] = {}
    for name, ep in backend_entry_points().items():
        if ep.value.startswith(BUILTIN):
            cls = ep.load()
            assert isinstance(cls, type) and issubclass(cls, Backend)
            declared[name] = ", ".join(cls.precisions)
    assert declared, "no built-in backend is registered"
    assert listed == declared


def test_the_table_reader_sees_a_wrong_row() -> None:
    text = README.read_text(encoding="utf-8")
    assert readme_backends(text.replace("| `numpy` | ", "| `numpy` | bf16, ", 1))["numpy"].startswith("bf16, ")
