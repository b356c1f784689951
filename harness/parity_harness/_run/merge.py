"""Merge the JSON reports of sharded runs (`parity merge`) into one report, verdict and exit code.

Each CI job (one per backend group, per platform) runs `parity run --backends ... --json R.json`
on the same fixture; one job then merges the files. The merged report holds every input's
results, tap summaries, first divergences, runs, budget rows and decoding checks, so its verdict and counts are
those of one run of every backend. Refused (exit 2, one line naming the file): a file that is not
a parity report, a schema version this parity does not read (strictly the integer: not `true`, not 1.0), a
report whose `command` is not `run` or `compare` (absent: theirs), the marker of a run that ended in an
error (`"usable": false`), a report with a run a backend crashed in (status "crashed"), a report
that disagrees with its own rows (parity_harness/_run/report_check.py),
reports without a fixture id or of different fixtures or tolerances, reports whose results cover
other cases or taps, and two reports holding the same backend x precision (forward or decoding).
"""

from __future__ import annotations

import enum
import json
import math
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from parity_harness._backends.guard import one_line
from parity_harness._compare.budget import GOLDEN_FP32, BudgetRow
from parity_harness._compare.judge import FAIL, SYSTEMATIC_CASE, CheckResult, FirstDivergence, TapSummary
from parity_harness._compare.report import BackendRun, Report, read_from
from parity_harness._core.input_files import MAX_REPORT_BYTES, InputFileError, read_input_bytes
from parity_harness._core.status import RunStatus
from parity_harness._core.strict_json import StrictJSONError, loads_strict
from parity_harness._run.report_check import MergeError, check_report
from parity_harness._views.console import SCHEMA_VERSION, report_json

if TYPE_CHECKING:
    from parity_harness._compare.decoding import DecodingReport

T = TypeVar("T")


__all__ = ["MergeError", "merge_reports", "read_report"]


_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _build(cls: type[T], row: Any, path: Path, what: str, **extra: Any) -> T:
    """A report dataclass from a JSON object: known fields only (later additions to schema 1 are ignored)."""
    if not isinstance(row, dict):
        raise MergeError(f"{path}: malformed report: an entry of {what!r} is not an object")
    hints = _hints(cls)
    known = {k: v for k, v in row.items() if k in hints}
    for key, value in known.items():
        if not _conforms(value, hints[key]):
            raise MergeError(f"{path}: malformed report: {what}.{key} is {_show(value)}, "
                             f"expected {_type_name(hints[key])}")
    # JSON writes a non-finite number as null and names it in "nonfinite" (parity_harness/_views/console.py); a
    # report written before "nonfinite" existed had only infinite errors there: a plain float that is null was inf.
    nonfinite = row.get("nonfinite")
    if nonfinite is not None:
        if not isinstance(nonfinite, dict) or not all(isinstance(v, str) and v in _NONFINITE
                                                      for v in nonfinite.values()):
            raise MergeError(f"{path}: malformed report: {what}.nonfinite is {_show(nonfinite)}, expected "
                             "{field: \"inf\" | \"-inf\" | \"nan\"}")
        for key, text in nonfinite.items():
            if key in known and known[key] is not None:
                raise MergeError(f"{path}: malformed report: {what}.{key} is {_show(known[key])}, but nonfinite "
                                 f"names it {text!r}")
            if key in hints:
                known[key] = _NONFINITE[text]
    known.update({k: math.inf for k, v in known.items() if v is None and hints[k] is float})
    known.update({k: hints[k](v) for k, v in known.items() if _is_enum(hints[k])})  # "ok" -> Status.OK
    try:
        return cls(**known, **extra)
    except TypeError as exc:
        raise MergeError(f"{path}: malformed report: an entry of {what!r} lacks a field ({exc})") from None


def _hints(cls: Any) -> dict[str, Any]:
    """A report dataclass's field annotations, evaluated (cached: the same few classes for every row)."""
    if cls not in _HINTS:
        _HINTS[cls] = _field_hints(cls)
    return _HINTS[cls]


_HINTS: dict[Any, dict[str, Any]] = {}


def _field_hints(cls: Any) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


def _conforms(value: object, hint: Any) -> bool:
    """Whether a JSON value fits a report field's annotation (a float may be null: an infinity in JSON)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if _is_enum(hint):  # a status (parity_harness/_core/status.py): one of its values
        return isinstance(value, str) and value in {m.value for m in hint}
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return type(value) is bool
    if hint is int:
        return type(value) is int
    if hint is float:
        return value is None or type(value) in (int, float)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())
    return True  # a type not written to JSON by parity: not checked


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def _type_name(hint: Any) -> str:
    if _is_enum(hint):
        return " | ".join(repr(m.value) for m in hint)
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _show(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _restore_infinities(row: CheckResult | TapSummary | BudgetRow) -> None:
    """The JSON writes infinite errors (structural failures: shape, NaN, infinity) as null: read them back.

    A failing row without an error is a structural failure (infinite), unless the tap was missing.
    """
    if row.status != FAIL or row.max_abs is not None or row.message.startswith("missing"):
        return
    row.max_abs = math.inf
    if isinstance(row, BudgetRow):
        row.eps32_units = row.eps64_units = math.inf
    else:
        row.max_rel = row.min_atol = math.inf


def _list(doc: dict[str, Any], key: str, path: Path) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise MergeError(f"{path}: malformed report: {key!r} is not a list")
    return value


# The commands whose report holds a run's rows, which merge takes (a usable report of any other command is refused).
MERGED_COMMANDS = ("run", "compare")


def read_report(path: Path) -> dict[str, Any]:
    """A parity JSON report, checked for its schema and version."""
    try:  # a regular file under its cap (_core/input_files.py), then strict JSON: no NaN, Infinity or repeated key
        doc = loads_strict(read_input_bytes(path, "report", MAX_REPORT_BYTES).decode("utf-8"))
    except InputFileError as exc:
        raise MergeError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise MergeError(f"{path}: not valid JSON (not UTF-8: {exc.reason})") from None
    except StrictJSONError as exc:
        raise MergeError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "parity-report":
        raise MergeError(f"{path}: not a parity report (no \"schema\": \"parity-report\")")
    version = doc.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # strictly: true == 1 and 1.0 == 1 in Python
        raise MergeError(f"{path}: report schema version {one_line(repr(version))[:80]}, "
                         f"this parity merges version {SCHEMA_VERSION}")
    usable = doc.get("usable", True)  # absent: written before the marker existed (still checked against its rows)
    if usable is False:
        error = one_line(str(doc.get("error", "")))[:300]
        raise MergeError(f"{path}: unusable: its `parity {one_line(str(doc.get('command', 'run')))}` ended in an "
                         f"error (exit_code {doc.get('exit_code')!r}: {error}); not merged")
    if usable is not True:
        raise MergeError(f"{path}: malformed report: 'usable' is {usable!r}, expected true or false")
    command = doc.get("command", "run")  # absent in what run, compare and merge write; only a marker names it
    if type(command) is not str or command not in MERGED_COMMANDS:
        raise MergeError(f"{path}: a report of `parity {one_line(str(command))[:80]}`, not of "
                         f"{' or '.join(f'`parity {c}`' for c in MERGED_COMMANDS)}: not merged")
    runs = doc.get("runs")
    crashed = [r for r in runs if isinstance(r, dict) and r.get("status") == RunStatus.CRASHED] \
        if isinstance(runs, list) else []
    if crashed:
        r = crashed[0]
        raise MergeError(f"{path}: backend {one_line(str(r.get('backend', '?')))} crashed "
                         f"({one_line(str(r.get('precision', '?')))}) in this run: "
                         f"{one_line(str(r.get('message', '')))[:300]}; not merged")
    if not isinstance(doc.get("fixture_id"), str) or not doc["fixture_id"]:
        raise MergeError(f"{path}: the report has no fixture_id (written by an older parity): cannot tell "
                         "which fixture it is about")
    top: dict[str, Any] = {"fixture": str, "tolerances": dict[str, Any], "tolerances_loose": list[str],
                           "manifest_sha256": str}  # the lists are checked where they are read (`_list`)
    for key, hint in top.items():
        if key in doc and not _conforms(doc[key], hint):
            raise MergeError(f"{path}: malformed report: {key} is {_show(doc[key])}, expected {_type_name(hint)}")
    return doc


def read_shard(path: Path, doc: dict[str, Any]) -> Report:
    """One report's rows as a Report (infinities restored), checked against its own verdict fields."""
    shard = Report(str(doc.get("fixture", "")), fixture_id=doc["fixture_id"], tolerances=_tolerances(doc))
    shard.runs = [_build(BackendRun, r, path, "runs") for r in _list(doc, "runs", path)]
    shard.results = [_build(CheckResult, r, path, "results") for r in _list(doc, "results", path)]
    shard.summaries = [_build(TapSummary, r, path, "taps") for r in _list(doc, "taps", path)]
    shard.budget = [_build(BudgetRow, r, path, "budget") for r in _list(doc, "budget", path)]
    rows: list[CheckResult | TapSummary | BudgetRow] = [*shard.results, *shard.summaries, *shard.budget]
    for row in rows:
        if not isinstance(row.status, str) or not isinstance(row.message, str):
            raise MergeError(f"{path}: malformed report: a row's 'status' or 'message' is not a string")
        _restore_infinities(row)
    divergences = doc.get("first_divergence", {})
    if not isinstance(divergences, dict):
        raise MergeError(f"{path}: malformed report: 'first_divergence' is not an object")
    for backend, entries in divergences.items():
        shard.divergences += [_build(FirstDivergence, e, path, "first_divergence", backend=backend)
                              for e in (entries if isinstance(entries, list) else [entries])]
    shard.skipped = [line for line in _list(doc, "skipped", path) if isinstance(line, str)]
    if "decoding" in doc:
        if not isinstance(doc["decoding"], dict):
            raise MergeError(f"{path}: malformed report: 'decoding' is not an object")
        shard.decoding = _read_decoding(path, doc["decoding"])
    check_report(path, doc, shard, report_json(shard))
    return shard


def merge_reports(paths: list[Path]) -> Report:
    """One Report from the JSON reports of several runs of the same fixture (see the module docstring)."""
    docs = [(p, read_report(p)) for p in paths]
    first_path, first = docs[0]
    report = Report(str(first.get("fixture", "")), fixture_id=first["fixture_id"], tolerances=_tolerances(first),
                    read_from=read_from(paths, "a report it merged"))
    owner: dict[tuple[str, str], Path] = {}
    decoded_by: dict[tuple[str, str], Path] = {}
    golden_rows_seen = False
    first_grid: tuple[set[str], set[str]] | None = None
    decodings: list[DecodingReport] = []
    for path, doc in docs:
        if doc["fixture_id"] != first["fixture_id"]:
            raise MergeError(f"{path}: a report of another fixture (fixture_id {doc['fixture_id'][:19]}..., "
                             f"{first_path} has {first['fixture_id'][:19]}...)")
        if _tolerances(doc) != report.tolerances:  # the id leaves tolerances out: a shard may not judge looser
            seals = str(doc.get("manifest_sha256", ""))[:12], report.tolerances["manifest_sha256"][:12]
            raise MergeError(f"{path}: judged with other tolerances than {first_path} "
                             f"(manifest_sha256 {seals[0]}... vs {seals[1]}...)")
        shard = read_shard(path, doc)
        grid = ({r.case for r in shard.results if r.case != SYSTEMATIC_CASE}, {r.tap for r in shard.results})
        first_grid = first_grid or grid
        if grid != first_grid:
            raise MergeError(f"{path}: its results cover {len(grid[0])} cases x {len(grid[1])} taps, those of "
                             f"{paths[0]} {len(first_grid[0])} x {len(first_grid[1])} (or other ones): not merged")
        for run in shard.runs:
            key = (run.backend, run.precision)
            if run.status != RunStatus.NOT_SUPPORTED and key in owner:
                raise MergeError(f"{path}: {run.backend} {run.precision} is in {owner[key]} too: "
                                 "each backend x precision must come from one report")
        for run in shard.runs:
            if run.status != RunStatus.NOT_SUPPORTED:
                owner[(run.backend, run.precision)] = path
        if shard.decoding is not None:
            for dec_run in shard.decoding.runs:
                key = (dec_run.backend, dec_run.precision)
                if key in decoded_by:
                    raise MergeError(f"{path}: the decoding of {key[0]} {key[1]} is in {decoded_by[key]} too: "
                                     "each backend x precision must come from one report")
                decoded_by[key] = path
            decodings.append(shard.decoding)
        report.runs += shard.runs
        report.results += shard.results
        report.summaries += shard.summaries
        report.divergences += shard.divergences
        rows = shard.budget
        if golden_rows_seen:  # the fixture's own golden.fp32 row: once, from the first report that has it
            rows = [r for r in rows if r.backend != GOLDEN_FP32]
        golden_rows_seen = golden_rows_seen or any(r.backend == GOLDEN_FP32 for r in rows)
        report.budget += rows
        for line in shard.skipped:
            if line not in report.skipped:
                report.skipped.append(line)
    # A backend skipped on one machine but run on another was not skipped by the merged run.
    ran = {run.backend for run in report.runs if run.status != RunStatus.NOT_SUPPORTED}
    report.skipped = [s for s in report.skipped if not any(s.startswith(f"backend {b!r} ") for b in ran)]
    report.decoding = _merge_decoding(decodings)
    return report


def _tolerances(doc: dict[str, Any]) -> dict[str, Any]:
    """The tolerances a report was judged with, as `Fixture.tolerance_summary()` gives them."""
    return {"tiers": doc.get("tolerances", {}), "loose": list(doc.get("tolerances_loose", [])),
            "reduced_c": dict(doc.get("reduced_c", {})), "manifest_sha256": str(doc.get("manifest_sha256", ""))}


def _read_decoding(path: Path, dec: dict[str, Any]) -> DecodingReport:
    """One report's decoding section (parity_harness/_run/decode_check.py) as a DecodingReport."""
    from parity_harness._compare.decoding import DecodeRun, DecodingReport, GreedyCheck

    _check_decoding_header(path, dec)

    out = DecodingReport(available=dec.get("available") is True)
    if out.available:
        out.steps = int(dec.get("steps", 0))
        out.prompts = [str(p) for p in _list(dec, "prompts", path)]
        out.taps = [str(t) for t in _list(dec, "taps", path)]
        out.vocab = [str(w) for w in _list(dec, "vocab", path)]
        sequences = dec.get("sequences", {})
        out.sequences = {str(k): [int(t) for t in v] for k, v in sequences.items()} \
            if isinstance(sequences, dict) else {}
    out.checks = [_build(CheckResult, r, path, "decoding.results") for r in _list(dec, "results", path)]
    out.summaries = [_build(TapSummary, r, path, "decoding.summaries") for r in _list(dec, "summaries", path)]
    out.divergences = [_build(FirstDivergence, r, path, "decoding.first_divergence")
                       for r in _list(dec, "first_divergence", path)]
    out.greedy = [_build(GreedyCheck, r, path, "decoding.greedy") for r in _list(dec, "greedy", path)]
    out.runs = [_build(DecodeRun, r, path, "decoding.runs") for r in _list(dec, "runs", path)]
    out.not_supported = [str(n) for n in _list(dec, "not_supported", path)]
    for check in out.checks:
        _restore_infinities(check)
    return out


def _merge_decoding(parts: list[DecodingReport]) -> DecodingReport | None:
    """The decoding sections of the reports, merged; None when none has one."""
    from parity_harness._compare.decoding import DecodingReport

    if not parts:
        return None
    merged = DecodingReport(available=False)
    for dec in parts:
        if dec.available and not merged.available:
            merged.available, merged.steps, merged.prompts = True, dec.steps, dec.prompts
            merged.taps, merged.vocab, merged.sequences = dec.taps, dec.vocab, dec.sequences
        merged.checks += dec.checks
        merged.summaries += dec.summaries
        merged.divergences += dec.divergences
        merged.greedy += dec.greedy
        merged.runs += dec.runs
        merged.not_supported += [n for n in dec.not_supported if n not in merged.not_supported]
    decoded = {run.backend for run in merged.runs}
    merged.not_supported = [n for n in merged.not_supported if n not in decoded]
    return merged


def _check_decoding_header(path: Path, dec: dict[str, Any]) -> None:
    """The decoding section's own fields, typed, before they are read (one line naming the field)."""
    expected: dict[str, Any] = {"available": bool, "steps": int, "prompts": list[str], "taps": list[str],
                                "vocab": list[str], "sequences": dict[str, list[int]], "not_supported": list[str]}
    for key, hint in expected.items():
        if key in dec and not _conforms(dec[key], hint):
            raise MergeError(f"{path}: malformed report: decoding.{key} is {_show(dec[key])}, "
                             f"expected {_type_name(hint)}")
