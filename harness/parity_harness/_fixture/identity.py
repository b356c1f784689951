"""The fixture id: a content hash of what a fixture asks backends to compute, in any language.

    fixture_id = "sha256:" + hex(sha256(canonical_json({
        "cases": [{"name": str, "tokens": [int, ...]}, ...],   # the manifest's order
        "config": the manifest's "config" object, as written,
        "vocab": [str, ...],
        "weights_sha256": hex sha256 of the weights file's bytes,
    })))

`canonical_json` is RFC 8785 (the JSON Canonicalization Scheme): object keys sorted, no
whitespace, strings as ECMAScript's JSON.stringify writes them (UTF-8, only `"`, `\\` and control
characters escaped), numbers as ECMAScript writes them (`1e-05` is `0.00001`, `8.0` is `8`). In
JavaScript that is `JSON.stringify` with sorted keys (ts_model/node/dump-format.ts).

The golden files and the tolerances are left out on purpose: goldens regenerated from the same
weights on another CPU (a few ulps apart) or a retuned tolerance keep the fixture's id, so dumps
made for it stay valid. Specified in docs/dump-format.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

from parity_harness._fixture.fixture import Fixture, sha256_file

ID_PREFIX = "sha256:"


def ecmascript_number(x: float) -> str:
    """A finite number as ECMAScript's Number::toString writes it (RFC 8785 section 3.2.2.3)."""
    if not math.isfinite(x):
        raise ValueError(f"{x!r} has no JSON form")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # repr is the shortest round-tripping decimal, as in ECMAScript; only the layout differs.
    _, digit_tuple, exponent = Decimal(repr(abs(float(x)))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = int(exponent) + k  # the value is 0.DIGITS x 10^n
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        body = "0." + "0" * -n + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        body = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + body


def canonical_json(value: Any) -> str:
    """RFC 8785 canonical JSON of plain JSON data (dict with str keys, list, str, int, float, bool, None)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return ecmascript_number(float(value)) if abs(value) >= 2**53 else str(value)
    if isinstance(value, float):
        return ecmascript_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("canonical JSON needs string keys")
        # RFC 8785 sorts keys by UTF-16 code units.
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(f"{canonical_json(k)}:{canonical_json(value[k])}" for k in keys) + "}"
    raise TypeError(f"{type(value).__name__} is not JSON data")


def fixture_id_document(fixture: Fixture) -> dict[str, Any]:
    """What the fixture id hashes (see the module docstring)."""
    return {
        "cases": [{"name": c.name, "tokens": list(c.tokens)} for c in fixture.cases],
        "config": fixture.manifest["config"],
        "vocab": list(fixture.vocab),
        "weights_sha256": sha256_file(fixture.weights_path),
    }


def fixture_id(fixture: Fixture) -> str:
    """"sha256:<hex>": the content hash of the fixture's config, vocabulary, cases and weights."""
    text = canonical_json(fixture_id_document(fixture))
    return ID_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()
