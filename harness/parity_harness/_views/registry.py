"""The views a report renders to, by name: `api.render(report, fmt)` and the docs list exactly these.

Each view is a function of the report's tree (`Report.tree`) returning text. Adding a view is one module with
that function plus one line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parity_harness._compare.report import Report


@dataclass(frozen=True)
class View:
    label: str  # what a written file of it is called in messages ("JUnit file")
    module: str
    function: str  # (report: Report, verbose: int) -> str


VIEWS: dict[str, View] = {
    "text": View("text report", "parity_harness._views.console", "report_text"),
    "json": View("JSON report", "parity_harness._views.console", "report_json_text"),
    "junit": View("JUnit file", "parity_harness._views.junit", "junit_text"),
    "markdown": View("Markdown summary", "parity_harness._views.markdown", "markdown_text"),
}


def render_view(report: Report, name: str, verbose: int = 0) -> str:
    """The report rendered by the view called `name` (a key of VIEWS)."""
    view = VIEWS[name]
    function = getattr(importlib.import_module(view.module), view.function)
    return str(function(report, verbose))
