"""Strict JSON for files parity trusts: no NaN or Infinity, no duplicate keys, bounded size and depth.

Python's `json` accepts `NaN`, `Infinity`, `1e999` (read as infinity) and a repeated key (the last
copy wins): each of those once let a manifest declare a tolerance that passes anything. Here each
is refused with one line naming the file, as is nesting deep enough to exhaust the recursion limit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from parity_harness._core.input_files import MAX_MANIFEST_BYTES, read_input_bytes

MAX_BYTES = MAX_MANIFEST_BYTES  # the default cap of `load_strict` (every cap: parity_harness/_core/input_files.py)
MAX_DEPTH = 64  # the manifest nests 4 levels deep


class StrictJSONError(ValueError):
    """The text is not strict JSON; the message is one line."""


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a JSON number (NaN and Infinity are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"{text[:40]} overflows to infinity")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise StrictJSONError(f"duplicate key {key!r} (a repeated key is refused, not resolved)")
        obj[key] = value
    return obj


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings (a cheap scan before parsing)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_strict(text: str) -> Any:
    """Parse `text`; StrictJSONError (one line) on anything but strict, finite, unambiguous JSON."""
    if _depth(text) > MAX_DEPTH:
        raise StrictJSONError(f"nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_duplicates)
    except StrictJSONError:
        raise
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise StrictJSONError(f"not valid JSON ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})") from None


def load_strict(path: Path, what: str = "manifest", max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse a JSON file strictly; StrictJSONError naming what is wrong (not the path).

    The file must be a regular file of at most `max_bytes` (checked with `os.stat` before anything
    is read): an InputFileError (naming the path) otherwise.
    """
    data = read_input_bytes(path, what, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return loads_strict(text)


def load_json_object(path: Path, what: str, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """A JSON object read strictly from `path` (`load_strict`); FixtureError naming the file otherwise.

    The one reader of parity's JSON inputs that are objects: the manifest, a checkpoint's config.json
    and vocab.json.
    """
    from parity_harness._core.errors import FixtureError

    try:
        value = load_strict(path, what, max_bytes)
    except StrictJSONError as exc:
        raise FixtureError(f"{path}: {exc}") from None
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(value, dict):
        raise FixtureError(f"{path}: the {what} must be a JSON object")
    return value
