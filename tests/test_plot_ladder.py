"""The error ladder (`parity run --plot`) reads at a glance: y ticks are powers of ten, both axes have titles.

matplotlib's own log labels are mathtext (`$\\mathdefault{10^{-2}}$`); with mathtext off for the figure
(outside strings must not be parsed) they were drawn as their source, cut at the left edge, and pushed
the y axis title off the picture (issue 37). The test renders the toy's ladder as SVG through the CLI
and reads the SVG: matplotlib writes each text's string as a comment before its glyphs, and places
the glyphs with a `translate(x y)`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import run_cli

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
