"""The error ladder (`parity run --plot`) reads at a glance: y ticks are powers of ten, both axes have titles.

matplotlib's own log labels are mathtext (`$\\mathdefault{10^{-2}}$`); with mathtext off for the figure
(outside strings must not be parsed) they were drawn as their source, cut at the left edge, and pushed
the y axis title off the picture (issue 37). The test renders the toy's ladder as SVG through the CLI
and reads the SVG: matplotlib writes each text's string as a comment before its glyphs, and places
the glyphs with a `translate(x y)`.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import run_cli

pytest.importorskip("matplotlib")

SVG = "{http://www.w3.org/2000/svg}"
POWER_OF_TEN = re.compile("^10⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+$")  # 10⁻¹², as drawn; never '$10^{-12}$'
TRANSLATE = re.compile(r"translate\(([-\d.e]+) ([-\d.e]+)\)")


def texts(group: ET.Element) -> list[tuple[str, float]]:
    """Each text drawn directly in `group` (an id="text_N" child): its string and the x where its glyphs start."""
    out = []
    for child in group:
        if not child.get("id", "").startswith("text_"):
            continue
        comment = next((c for c in child if c.tag is ET.Comment), None)  # type: ignore[comparison-overlap]
        glyphs = next((c for c in child if c.tag == f"{SVG}g"), None)
        assert comment is not None and glyphs is not None, f"{child.get('id')}: no text comment or glyphs"
        where = TRANSLATE.search(glyphs.get("transform", ""))
        assert where is not None, f"{comment.text!r}: no position"
        out.append(((comment.text or "").strip(), float(where.group(1))))
    return out


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> ET.Element:
    """The toy's error ladder (numpy: every tier), rendered by `parity run --plot ladder.svg`, parsed with comments."""
    svg = tmp_path_factory.mktemp("ladder") / "ladder.svg"
    proc = run_cli("run", "--backends", "numpy", "--plot", str(svg), "-q")
    assert proc.returncode == 0, proc.stderr
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    return ET.fromstring(svg.read_bytes(), parser=parser)


def axis(root: ET.Element, n: int) -> ET.Element:
    found = root.find(f".//{SVG}g[@id='matplotlib.axis_{n}']")
    assert found is not None, f"no matplotlib.axis_{n} in the SVG"
    return found


def test_y_ticks_are_powers_of_ten_inside_the_picture(ladder: ET.Element) -> None:
    ticks = [t for tick in axis(ladder, 2) if tick.get("id", "").startswith("ytick_") for t in texts(tick)]
    labels = [label for label, _ in ticks]
    assert len(ticks) >= 5, f"too few labelled y ticks: {labels}"
    assert all(POWER_OF_TEN.match(label) for label in labels), f"y tick labels are not powers of ten: {labels}"
    assert not [label for label in labels if "$" in label or "\\" in label], labels
    assert "10⁻¹²" in labels  # the fp64 tolerance's decade: the ladder spans it
    assert all(x >= 0 for _, x in ticks), f"a y tick label starts left of the picture: {ticks}"


def test_both_axes_have_titles_inside_the_picture(ladder: ET.Element) -> None:
    (x_title, _), = texts(axis(ladder, 1))
    assert "tap" in x_title
    (y_title, y_at), = texts(axis(ladder, 2))
    assert "max |actual - golden|" in y_title
    assert y_at >= 0, f"the y axis title starts left of the picture (x = {y_at})"


DOLLAR_NAME = "$\\sqrt{2}$-port"  # a backend name mathtext would draw as a square root
PLUGIN = '''"""A correct backend whose name is mathtext (tests/views/test_plot_ladder.py)."""
from typing import ClassVar
import numpy as np
from parity_harness._backends.base import Backend


class Dollar(Backend):
    name: ClassVar[str] = {name}
    description: ClassVar[str] = "returns the goldens"
    precisions: ClassVar[tuple[str, ...]] = ("fp64",)

    def run(self, fixture, precision):
        return {{c: {{t: np.array(a, copy=True) for t, a in taps.items()}}
                for c, taps in fixture.golden(precision).items()}}
'''


def test_a_backend_name_with_dollars_is_drawn_as_written(tmp_path: Path) -> None:
    """Text from outside (a plugin's name) is never parsed as mathtext: its '$' and '\\' are drawn as glyphs."""
    root = tmp_path / "plugin"
    root.mkdir()
    (root / "parity_dollar_plugin.py").write_text(PLUGIN.format(name=ascii(DOLLAR_NAME)), encoding="utf-8")
    info = root / "parity_dollar_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: parity-dollar-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[parity.backends]\n{DOLLAR_NAME} = parity_dollar_plugin:Dollar\n")
    svg = tmp_path / "ladder.svg"
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    proc = run_cli("run", "--backends", f"numpy,{DOLLAR_NAME}", "--precision", "fp64", "--plot", str(svg), "-q",
                   env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tree = ET.fromstring(svg.read_bytes(), parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    labels = [g for g in tree.iter(f"{SVG}g") if g.get("id", "").startswith("text_")
              and any(c.tag is ET.Comment and DOLLAR_NAME in (c.text or "") for c in g)]  # type: ignore[comparison-overlap]
    assert len(labels) == 2, "the legend names the backend's two tiers"  # fp64 vs fp64, fp64 vs fp32
    for label in labels:
        glyphs = {u.get("{http://www.w3.org/1999/xlink}href", "") for u in label.iter(f"{SVG}use")}
        assert {glyph("$"), glyph("\\")} <= glyphs, glyphs  # '$' and '\\' drawn as written
        assert glyph("\u221a") not in glyphs, glyphs  # no radical sign: nothing was parsed


def glyph(ch: str) -> str:
    """The SVG id matplotlib gives `ch`'s glyph in its default font (DejaVu Sans): '#DejaVuSans-<glyph index, hex>'."""
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    font = FT2Font(findfont(FontProperties()))
    return f"#{font.postscript_name}-{font.get_char_index(ord(ch)):x}"
