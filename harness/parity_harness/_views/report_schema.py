"""The JSON report's schema, a file (report.schema.json, shipped with the package), and its one validator.

The schema describes version 1 as `parity run|compare|merge --json` write it (the field list is in
`parity_harness._views.console`'s docstring and docs/reports.md): a report, or the unusable marker a command that
ended in an error leaves. tests/views/test_report_schema.py validates real reports against it, so the file and the
writer cannot drift apart.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def report_schema() -> dict[str, Any]:
    """The schema, read from the package (draft 2020-12)."""
    text = resources.files("parity_harness._views").joinpath("report.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def report_problems(doc: object, limit: int = 5) -> list[str]:
    """Where a JSON document breaks the report schema, one line each (at most `limit`); [] when it conforms."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(report_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:200]}" for e in errors[:limit]]


__all__ = ["report_problems", "report_schema"]
