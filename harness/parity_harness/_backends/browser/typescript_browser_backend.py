"""The `typescript-browser` backend: ts_model/model/model.ts bundled by esbuild and run in headless Chrome.

The same model as the `typescript` backend (from `PARITY_TS_DIR` or ts_model/), the same taps,
float64, but in the engine learners run it in: a real browser, its JavaScript engine, its Math.
Incremental decoding is not run in the browser: "not supported" (the typescript backend checks it under Node).
`ts_model/browser/run-browser.mts` does the work (parity_harness/_backends/browser/driver.py runs it; docs/browser.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.browser import driver as browser
from parity_harness._backends.node.runtime import split_by_case, ts_model_file
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


class TypeScriptBrowserBackend(Backend):
    name: ClassVar[str] = "typescript-browser"
    description: ClassVar[str] = "ts_model/model/model.ts bundled by esbuild, in headless Chrome (puppeteer-core), " \
        "float64"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)
    install_hint: ClassVar[str] = browser.INSTALL_HINT
    concurrent: ClassVar[bool] = True  # one browser session for the run, behind its lock; no process-wide state
    out_of_process: ClassVar[bool] = True  # the browser computes: a side lane on a small fixture (_run/lanes.py)
    streams: ClassVar[bool] = False  # the browser driver returns every case at once (run)

    def declines(self, fixture: Fixture) -> str | None:
        return browser.declines_big(fixture)

    def missing_dependencies(self) -> list[str]:
        out = browser.missing()
        if not out and not ts_model_file("model.ts").is_file():
            out.append(f"{ts_model_file('model.ts')} (a source checkout, or PARITY_TS_DIR)")
        return out

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision != "fp64":
            raise BackendFailed(f"{self.name} computes in float64 only, not {precision}")
        tensors, _ = browser.run_to_file(self.name, "typescript", fixture.root, [])
        return split_by_case(fixture, tensors, self.name)
