"""Hostile text: a string from outside reaches no view raw (parity_harness/_core/sanitize.py, docs/security.md).

For each source of outside strings (plugin names, descriptions, install hints, `declines()` reasons,
`missing_dependencies()`, exception text; dump metadata; fields of JSON reports given to `parity
merge`; fixture case names, vocabulary words, case text, provenance, the fixture's directory name;
mutant names), a hostile string (`ESC [2K` + CR + a fake `PASS`, U+2028 + a fake line, U+202E, NUL,
a lone surrogate where the source can hold one, U+FFFF) goes in, and the test checks every view it
reaches: the terminal output holds no control character and no line the string started; the JUnit
file parses with `xml.etree.ElementTree` and `xml.dom.minidom`; the Markdown holds no raw control
character and no extra line or column; an SVG picture parses. Whether a character is forbidden is
decided here independently of the sanitizer (`forbidden`). The case ids start with their class:
`unit`, `view`, `plugin`, `dump`, `merge`, `fixture`, `selftest`, `cli`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import xml.dom.minidom
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from parity_harness._core.sanitize import (
    SafeStream,
    markdown_cell,
    one_line,
    plot_label,
    safe_line,
    safe_text,
    xml_text,
)
from tests.helpers import assert_exit_2_one_line, edit_manifest, perturb_weight, rehash, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

FAKE = "parity: fake line"
# Every trick at once. Sources that cannot hold some of these characters get a subset (below).
HOSTILE = f"\x1b[2K\rPASS: every backend agrees\u2028{FAKE}\u202e\x00\ud800\uffff\x1b]0;title\x07\x85\u2029"
# No lone surrogate (UTF-8 files: safetensors metadata and keys, entry-point files), no NUL (argv).
HOSTILE_UTF8 = HOSTILE.replace("\ud800", "")
HOSTILE_ARG = HOSTILE_UTF8.replace("\x00", "")
# An entry-point name: no line break of str.splitlines (the file is read line by line), no '=', no NUL (argv).
HOSTILE_NAME = "evil\x1b[2K\u202e\uffff\x9b2K"


def forbidden(ch: str) -> bool:
    """What must never reach a view raw: controls but the line feed, line separators, bidi and zero-width
    controls, the BOM, lone surrogates, U+FFFE/U+FFFF."""
    o = ord(ch)
    return ((o < 0x20 and ch != "\n") or 0x7F <= o <= 0x9F or o in (0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF)
            or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069 or 0x200B <= o <= 0x200F or 0xD800 <= o <= 0xDFFF)


def assert_clean_terminal(text: str, verdict: str | None = None) -> None:
    """No forbidden character, no line the hostile string started; `verdict`: the one line starting with PASS/FAIL."""
    bad = sorted({f"U+{ord(c):04X}" for c in text if forbidden(c)})
    assert not bad, (bad, text[-2000:])
    lines = text.splitlines()
    assert lines == text.removesuffix("\n").split("\n") or not text, "a line break other than \\n"
    assert not [ln for ln in lines if ln.lstrip().startswith(FAKE)], text[-2000:]
    passes = [ln for ln in lines if ln.startswith("PASS")]
    if verdict == "PASS":
        assert passes == [lines[-1]], passes
    else:
        assert not passes, passes
        if verdict == "FAIL":
            assert lines[-1].startswith("FAIL"), lines[-1]


def assert_valid_junit(path: Path) -> ET.Element:
    """The file parses with both parsers, and no attribute or text holds a forbidden character."""
    data = path.read_bytes()
    root = ET.fromstring(data)
    xml.dom.minidom.parseString(data)
    for element in root.iter():
        for value in [*element.attrib.values(), element.text or "", element.tail or ""]:
            assert not [c for c in value if forbidden(c)], (element.tag, value)
    return root


def assert_clean_markdown(text: str) -> None:
    assert not [c for c in text if forbidden(c)], text
    assert FAKE not in [ln.strip("*- ") for ln in text.splitlines()]
    assert "<" not in text  # no raw HTML: '<' is written as &lt;
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    columns = {len(ln.replace("\\|", "").split("|")) for ln in rows}
    assert len(columns) == 1, rows  # no cell added a column


def assert_clean_svg(path: Path) -> None:
    ET.parse(path)  # control characters in an SVG's text would make it unparseable
    assert not [c for c in path.read_text(encoding="utf-8") if forbidden(c)]


# -- unit: the rule itself -------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2K", "\\x1b[2K"), ("\rPASS", " PASS"), ("a\u2028b", "a b"), ("a\u2029b", "a b"), ("a\x85b", "a b"),
    ("\u202eabc", "\\u202eabc"), ("\u2066x\u2069", "\\u2066x\\u2069"), ("nul\x00", "nul\\x00"),
    ("\ud800", "\\ud800"), ("\uffff\ufffe", "\\uffff\\ufffe"), ("\x7f\x9b", "\\x7f\\x9b"), ("z\u200bw", "z\\u200bw"),
    ("\ufeff", "\\ufeff"), ("\U000e0041", "\\U000e0041"), ("tab\tx", "tab x"), ("a\nb", "a b"),
], ids=lambda v: ascii(v))
def test_unit_each_unsafe_character_is_escaped_or_a_space(raw: str, shown: str) -> None:
    assert safe_line(raw) == shown
    assert not [c for c in safe_line(raw) if forbidden(c)]


@pytest.mark.parametrize("text", ["plain ascii 1e-05 |x|", "café", "日本語", "emoji \U0001f600", "nbsp\xa0here",
                                  "ideographic\u3000space", "private \ue000 use"])
def test_unit_printable_text_is_unchanged(text: str) -> None:
    assert safe_line(text) == text
    assert safe_text(text) == text


def test_unit_the_rule_is_idempotent_and_one_line_collapses_breaks() -> None:
    once = safe_line(HOSTILE)
    assert safe_line(once) == once and one_line(once) == one_line(HOSTILE)
    assert "\n" not in one_line("first\r\n\u2028second") and one_line("first\r\n\u2028second") == "first second"
    assert one_line("x" * 500, limit=20) == "x" * 17 + "..."
    assert safe_text("a\nb\rc\x1b") == "a\nb c\\x1b"


def test_unit_xml_text_of_every_kind_of_code_point_parses() -> None:
    """C0, C1, surrogates, noncharacters, the top of the BMP and of the planes: the result is always XML 1.0."""
    points = [*range(0, 0x300), *range(0x2000, 0x2070), *range(0xD7F0, 0xE010), *range(0xFDD0, 0xFDF0),
              *range(0xFFF0, 0x10000), 0x1FFFE, 0x1FFFF, *range(0xE0000, 0xE0080), 0x10FFFF]
    text = "".join(map(chr, points))
    root = ET.Element("t", value=xml_text(text))
    root.text = xml_text(text, newlines=True)
    data = ET.tostring(root, encoding="utf-8")
    parsed = ET.fromstring(data)
    xml.dom.minidom.parseString(data)
    assert "\n" not in parsed.attrib["value"] and not [c for c in parsed.attrib["value"] if forbidden(c)]
    assert not [c for c in parsed.text or "" if forbidden(c)]


def test_unit_markdown_cells_and_plot_labels() -> None:
    assert markdown_cell("a|b<img src=x>") == "a\\|b&lt;img src=x>"
    assert plot_label("_hidden") == " _hidden" and plot_label("$x$") == "$x$"


def test_unit_the_stream_backstop_keeps_only_a_final_line_feed() -> None:
    buf = io.StringIO()
    print(f"backend {HOSTILE}", "and more", file=SafeStream(buf))  # type: ignore[arg-type]
    assert buf.getvalue().count("\n") == 1 and buf.getvalue().endswith("\n")
    assert_clean_terminal(buf.getvalue())
    SafeStream(buf).writelines([f"{HOSTILE}\n", "second\n"])  # type: ignore[arg-type]
    assert buf.getvalue().count("\n") == 3
    assert_clean_terminal(buf.getvalue())


# -- a failing JSON report (a perturbed weight, numpy) and the same report with hostile strings -------


def _hostile_report(doc: dict[str, Any], tag: str) -> dict[str, Any]:
    """The report with every outside string (backend, case, prompt, word, message, fixture, skipped) tagged."""
    def name(s: str) -> str:
        return s + tag if s else s

    def walk(obj: Any) -> Any:
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in ("backend", "case", "worst_case", "prompt", "message", "location", "worst") and isinstance(v, str):
                out[k] = name(v)
            elif k in ("by_case",):
                out[k] = {name(c): t for c, t in v.items()}
            elif k == "sequences":
                out[k] = {name(p): s for p, s in v.items()}
            elif k in ("prompts", "vocab", "not_supported", "skipped") and isinstance(v, list):
                out[k] = [name(s) for s in v]
            elif k == "first_divergence" and isinstance(v, dict):
                out[k] = {name(b): walk(rows) for b, rows in v.items()}
            elif k == "taps_compared":
                out[k] = {name(b): n for b, n in v.items()}
            else:
                out[k] = walk(v)
        return out

    hostile: dict[str, Any] = walk(doc)
    hostile["fixture"] = doc["fixture"] + tag
    hostile["skipped"] = [f"backend 'x{tag}' needs y{tag}, which is not available; install with: {tag}"]
    return hostile


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, toy_dir: Path) -> tuple[Path, Path]:
    """(the failing JSON report of numpy on a perturbed toy, the same report with HOSTILE in every outside string)."""
    root = tmp_path_factory.mktemp("reports")
    fixture = root / "toy"
    shutil.copytree(toy_dir, fixture)
    perturb_weight(fixture, "h.1.mlp.c_fc.weight", (0, 0), 1e-3)
    proc = run_cli("run", "--fixture", str(fixture), "--backends", "numpy", "-q", "--json", str(root / "r.json"))
    assert proc.returncode == 1, proc.stdout[-1000:] + proc.stderr[-1000:]
    doc = json.loads((root / "r.json").read_text())
    (root / "hostile.json").write_text(json.dumps(_hostile_report(doc, HOSTILE)))  # ensure_ascii: \ud800 escaped
    return root / "r.json", root / "hostile.json"


def _views(path: Path) -> tuple[str, str, bytes]:
    """(terminal, Markdown, JUnit bytes) of a report read back by `parity merge`, rendered in process."""
    from parity_harness._run.merge import merge_reports
    from parity_harness._views.console import print_report
    from parity_harness._views.junit import junit_element
    from parity_harness._views.markdown import markdown_summary

    report = merge_reports([path])
    out = io.StringIO()
    print_report(report, out, verbose=True, budget=True)
    return out.getvalue(), markdown_summary(report), ET.tostring(junit_element(report), encoding="utf-8")


def test_view_every_view_renders_hostile_fields_safely_and_with_as_many_lines(reports: tuple[Path, Path]) -> None:
    """Each view of the hostile report: no forbidden character, valid XML, and the clean report's line count."""
    clean, hostile = (_views(p) for p in reports)
    terminal, markdown, junit = hostile
    assert_clean_terminal(terminal, verdict="FAIL")
    assert terminal.count("\n") == clean[0].count("\n")
    assert "\\x1b[2K PASS: every backend agrees" in terminal  # shown, escaped, not executed
    assert_clean_markdown(markdown)
    assert markdown.count("\n") == clean[1].count("\n")
    root = ET.fromstring(junit)
    xml.dom.minidom.parseString(junit)
    failures = [f.text or "" for f in root.iter("failure")]
    assert failures and all(not [c for c in t if forbidden(c)] for t in failures)
    assert sum(t.count("\n") for t in failures) == sum((f.text or "").count("\n")
                                                       for f in ET.fromstring(clean[2]).iter("failure"))


def test_merge_hostile_report_through_the_cli(reports: tuple[Path, Path], tmp_path: Path) -> None:
    """`parity merge` of the hostile report: the same verdict (exit 1), every view safe."""
    proc = run_cli("merge", str(reports[1]), "--junit", str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"),
                   "-v")
    assert proc.returncode == 1, proc.stderr[-1500:]
    assert_clean_terminal(proc.stdout, verdict="FAIL")
    assert_clean_terminal(proc.stderr)
    assert_valid_junit(tmp_path / "r.xml")
    assert_clean_markdown((tmp_path / "r.md").read_text(encoding="utf-8"))


# -- plugins: names, descriptions, install hints, declines(), missing_dependencies(), exceptions ------

PLUGIN_SOURCE = '''"""Backends whose strings are hostile (tests/core/test_sanitize.py)."""
from typing import ClassVar
import numpy as np
from parity_harness._backends.base import Backend


HOSTILE = {hostile}


class Perfect(Backend):
    name: ClassVar[str] = "text-perfect"
    description: ClassVar[str] = HOSTILE
    install_hint: ClassVar[str] = HOSTILE
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "fp64")

    def run(self, fixture, precision):
        return {{c: {{t: np.array(a, copy=True) for t, a in taps.items()}}
                for c, taps in fixture.golden(precision).items()}}


class EvilName(Perfect):
    name: ClassVar[str] = {name}


class Declines(Perfect):
    name: ClassVar[str] = "text-declines"

    def declines(self, fixture):
        return HOSTILE


class Missing(Perfect):
    name: ClassVar[str] = "text-missing"

    def missing_dependencies(self):
        return [HOSTILE]


class Raises(Perfect):
    name: ClassVar[str] = "text-raises"

    def run(self, fixture, precision):
        raise RuntimeError(HOSTILE)
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plugin package registered by an entry-point file, as tests/hostile_plugin is."""
    root = tmp_path_factory.mktemp("text_plugin")
    (root / "parity_text_plugin.py").write_text(
        PLUGIN_SOURCE.format(hostile=ascii(HOSTILE), name=ascii(HOSTILE_NAME)), encoding="utf-8")
    info = root / "parity_text_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: parity-text-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        f"[parity.backends]\n{HOSTILE_NAME} = parity_text_plugin:EvilName\ntext-perfect = parity_text_plugin:Perfect\n"
        "text-declines = parity_text_plugin:Declines\ntext-missing = parity_text_plugin:Missing\n"
        "text-raises = parity_text_plugin:Raises\n", encoding="utf-8")
    return root


def run_plugin(plugin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(plugin_dir), os.environ.get("PYTHONPATH", "")) if p)
    return run_cli(*args, env={"PYTHONPATH": path}, timeout=300)


def test_plugin_hostile_name_is_refused_in_one_clean_line(plugin_dir: Path) -> None:
    """A registered name that is not printable is refused (registry); the line that says so is clean."""
    proc = run_plugin(plugin_dir, "run", "--backends", HOSTILE_NAME, "-q")
    assert_exit_2_one_line(proc, "evil\\x1b[2K\\u202e")
    assert_clean_terminal(proc.stderr)
    assert_clean_terminal(proc.stdout)


def test_plugin_hostile_description_and_declines_reason_in_a_passing_run(plugin_dir: Path, tmp_path: Path) -> None:
    """A correct backend with a hostile description, one that declines with a hostile reason: named and compared
    nothing, so exit 2 (issue 36), and every view still safe."""
    proc = run_plugin(plugin_dir, "run", "--backends", "numpy,text-perfect,text-declines", "--precision",
                      "fp64", "-q", "--junit", str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"),
                      "--plot", str(tmp_path / "r.svg"))
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert_clean_terminal(proc.stdout, verdict="ERROR")
    assert_clean_terminal(proc.stderr)
    assert "(\\x1b[2K PASS: every backend agrees" in proc.stdout  # the reason too
    root = assert_valid_junit(tmp_path / "r.xml")
    assert any("text-perfect" in s.get("name", "") for s in root.iter("testsuite"))
    assert_clean_markdown((tmp_path / "r.md").read_text(encoding="utf-8"))
    assert_clean_svg(tmp_path / "r.svg")


def test_plugin_hostile_description_install_hint_and_missing_in_parity_backends(plugin_dir: Path) -> None:
    """`parity backends`: one row per registered backend, whatever their descriptions and hints hold.

    The hostile name is listed as broken (exit 2, one line naming it); its row and that line are clean.
    """
    proc = run_plugin(plugin_dir, "backends")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-1500:]
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("parity: error: 1 registered backend(s) broken")
    assert "evil\\x1b[2K" in proc.stderr
    assert_clean_terminal(proc.stdout)
    assert_clean_terminal(proc.stderr)
    from parity_harness._backends.registry import backend_entry_points

    assert len(proc.stdout.splitlines()) == len(backend_entry_points()) + 5  # the built-ins and the plugin's 5
    assert "\\x1b[2K PASS: every backend agrees" in proc.stdout  # the description and the hint, escaped


def test_plugin_hostile_missing_dependency_is_one_clean_error_line(plugin_dir: Path) -> None:
    proc = run_plugin(plugin_dir, "run", "--backends", "text-missing")
    assert_exit_2_one_line(proc, "text-missing", "install with")
    assert_clean_terminal(proc.stderr)


def test_plugin_hostile_exception_text_is_one_clean_error_line(plugin_dir: Path) -> None:
    proc = run_plugin(plugin_dir, "run", "--backends", "text-raises", "--precision", "fp64", "-q")
    assert_exit_2_one_line(proc, "text-raises", "crashed in run", "RuntimeError")
    assert_clean_terminal(proc.stderr)
    assert_clean_terminal(proc.stdout)


# -- dumps: metadata ------------------------------------------------------------------------------


def test_dump_hostile_backend_metadata(toy_dir: Path, tmp_path: Path) -> None:
    """A dump whose metadata 'backend' holds everything but the line breaks `parity compare` refuses."""
    proc = run_cli("run", "--backends", "numpy", "--precision", "fp64", "-q", "--save-outputs", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-1500:]
    path = tmp_path / "numpy.fp64.safetensors"
    with safe_open(str(path), framework="numpy") as f:
        metadata = dict(f.metadata())
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata={**metadata, "backend": "np" + HOSTILE_UTF8.replace("\r", "")})
    proc = run_cli("compare", str(path), "--junit", str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"),
                   "--plot", str(tmp_path / "r.svg"), "-v")
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert_clean_terminal(proc.stdout, verdict="PASS")
    assert "np\\x1b[2K" in proc.stdout
    assert_valid_junit(tmp_path / "r.xml")
    assert_clean_markdown((tmp_path / "r.md").read_text(encoding="utf-8"))
    assert_clean_svg(tmp_path / "r.svg")


# -- fixtures: case names, vocabulary words, case text, provenance, the directory's name ---------------


def _rename_case(root: Path, old: str, new: str) -> None:
    for name in ("golden.fp32.safetensors", "golden.fp64.safetensors"):
        tensors = load_file(str(root / name))
        save_file({(new + k[len(old):] if k.startswith(old + "/") else k): v for k, v in tensors.items()},
                  str(root / name))


def test_fixture_hostile_case_name_word_text_and_provenance(toy_dir: Path, tmp_path: Path) -> None:
    """A disagreeing run (a perturbed weight) on a fixture whose strings are hostile, in a hostile directory."""
    fixture = tmp_path / f"toy{HOSTILE_ARG.replace('/', '')}"
    shutil.copytree(toy_dir, fixture)
    case = "repeated_token" + HOSTILE_UTF8  # the worst case of this perturbation: in FAIL lines and paragraphs
    _rename_case(fixture, "repeated_token", case)
    perturb_weight(fixture, "h.1.mlp.c_fc.weight", (0, 0), 1e-3)

    def change(m: dict[str, Any]) -> None:
        for c in m["cases"]:
            if c["name"] == "repeated_token":
                c["name"], c["text"] = case, HOSTILE
        m["vocab"][4] = "cat" + HOSTILE_UTF8 + "\nPASS"  # 'cat': in the decoding prompts and the divergence location
        m["provenance"]["command"] = HOSTILE

    edit_manifest(fixture, change)
    rehash(fixture)
    proc = run_cli("run", "--fixture", str(fixture), "--backends", "numpy", "-q", "-v", "--junit",
                   str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"), "--plot", str(tmp_path / "r.svg"))
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert_clean_terminal(proc.stdout, verdict="FAIL")
    assert_clean_terminal(proc.stderr)
    assert "repeated_token\\x1b[2K PASS" in proc.stdout  # the case is named, escaped
    assert "cat\\x1b[2K PASS" in proc.stdout  # and the word (the decoding prompts)
    root = assert_valid_junit(tmp_path / "r.xml")
    assert any("repeated_token\\x1b" in (f.text or "") for f in root.iter("failure"))
    assert_clean_markdown((tmp_path / "r.md").read_text(encoding="utf-8"))
    assert_clean_svg(tmp_path / "r.svg")


def test_fixture_lone_surrogate_in_a_word_is_one_clean_error_line(fixture_copy: Path) -> None:
    """A lone surrogate (JSON's "\\ud800") in the manifest: exit 2, one clean line, never a traceback or a pass."""
    edit_manifest(fixture_copy, lambda m: m["vocab"].__setitem__(4, "cat\ud800" + HOSTILE_UTF8))
    proc = run_cli("run", "--fixture", str(fixture_copy), "--backends", "numpy", "-q")
    assert_exit_2_one_line(proc)
    assert_clean_terminal(proc.stderr)
    assert_clean_terminal(proc.stdout)


# -- selftest: mutant names; the CLI's error line ---------------------------------------------------


def test_selftest_table_with_hostile_mutant_and_target_names() -> None:
    """print_selftest: hostile names and errors in every printed field, as many lines as with plain names."""
    from parity_harness._tools.selftest import Outcome, SelftestResult

    def result(tag: str) -> SelftestResult:
        r = SelftestResult(f"toy{tag}", controls={f"typescript{tag}": f"why{tag}"})
        r.outcomes = [Outcome(f"m{tag}", "typescript", f"d{tag}", f"blocks.0.hook{tag}", False, caught=True,
                              tiers=[f"fp64/fp64{tag}"], first_tap=f"t{tag}", error=f"e{tag}",
                              blind_cases=[f"c{tag}"]),
                      Outcome(f"n{tag}", "reference", "d", "logits", True, caught=False)]
        return r

    plain, hostile = io.StringIO(), io.StringIO()
    from parity_harness._tools.selftest import print_selftest

    print_selftest(result(""), plain)
    print_selftest(result(HOSTILE), hostile)
    assert_clean_terminal(hostile.getvalue())
    assert hostile.getvalue().count("\n") == plain.getvalue().count("\n")
    assert "m\\x1b[2K PASS" in hostile.getvalue()


def test_selftest_hostile_only_argument_is_one_clean_error_line() -> None:
    proc = run_cli("selftest", "--only", "x" + HOSTILE_ARG)
    assert_exit_2_one_line(proc, "unknown mutant")
    assert_clean_terminal(proc.stderr)


def test_cli_hostile_backend_argument_is_one_clean_error_line() -> None:
    proc = run_cli("run", "--backends", "x" + HOSTILE_ARG)
    assert_exit_2_one_line(proc, "unknown backend")
    assert_clean_terminal(proc.stderr)


def test_cli_error_line_of_a_hostile_exception_in_process(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main's error line and the stream backstop, in process: a ParityError whose text is hostile."""
    from parity_harness._cli import main as cli
    from parity_harness._core.errors import ParityError

    def boom(args: object) -> int:
        print(f"a plugin prints {HOSTILE}")
        raise ParityError(HOSTILE)

    monkeypatch.setattr(cli, "cmd_backends", boom)
    assert cli.main(["backends"]) == 2
    captured = capsys.readouterr()
    assert_clean_terminal(captured.out)
    assert_clean_terminal(captured.err)
    assert captured.out.count("\n") == 1 and captured.err.count("\n") == 1
    assert captured.err.startswith("parity: error: \\x1b[2K PASS")
