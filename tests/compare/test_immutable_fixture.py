"""The judge's inputs are immutable (issue 36, finding 2): what the caller of the judge holds cannot change the verdict.

A loaded `Fixture`'s cases, taps, rows, tolerances and goldens come from its sealed manifest and
cannot be edited by the code that calls the judge (the Python API, the pytest plugin's shared
`parity` fixture): an edit is refused, or has no effect on the verdict. Each hostile edit below
made a wrong backend pass on e9bda08 (except the two marked as guards: those were refused there too).
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pytest

from parity_harness import api
from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.precision import TIERS
from parity_harness._fixture.fixture import Fixture
from parity_harness._fixture.manifest import TierTolerances, Tolerance

pytest_plugins = ("pytester",)

REFUSED = (AttributeError, TypeError, ValueError, api.ParityError)  # whatever an edit raises, it must not pass


class OffAfterFirstCase(Backend):
    """The fp64 golden on the first case, the golden + `delta` on every tap of every other case."""

    name: ClassVar[str] = "off-after-first-case"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp64",)  # type: ignore[misc]
    delta = 0.5
    taps: tuple[str, ...] | None = None  # only these taps are off (None: every tap)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        first = fixture.cases[0].name
        out: BackendOutput = {}
        for case in fixture.cases:
            golden = fixture.golden_case("fp64", case.name)
            out[case.name] = {tap: np.array(a, dtype=np.float64) + (
                self.delta if case.name != first and (self.taps is None or tap in self.taps) else 0.0)
                for tap, a in golden.items()}
        return out


class OffAtLogits(OffAfterFirstCase):
    name: ClassVar[str] = "off-at-logits"
    taps = ("logits",)


def edit_and_judge(edit: Callable[[Fixture], object], backend: Backend) -> api.Report:
    """Load the toy, let `edit` change it (an edit refused is fine), then judge `backend` on it."""
    fx = api.load()
    with contextlib.suppress(*REFUSED):
        edit(fx)
    return api.run(backend, fx, "fp64", decoding=False)


def cut_cases(fx: Fixture) -> None:
    fx.cases = fx.cases[:1]  # type: ignore[misc]


def cut_cases_in_place(fx: Fixture) -> None:
    del fx.cases[1:]  # type: ignore[attr-defined]


def loosen_tier(fx: Fixture) -> None:
    for tier in TIERS:  # a fp64 result is judged against both goldens
        fx.tolerances[tier] = TierTolerances(Tolerance(1e9, 1e9))  # type: ignore[index]


def replace_tolerances(fx: Fixture) -> None:
    fx.tolerances = {p: TierTolerances(Tolerance(1e9, 1e9)) for p in ("fp32", "fp64")}  # type: ignore[misc]


def loosen_spec_override(fx: Fixture) -> None:
    for tier in TIERS:
        fx.spec.tolerances[tier].overrides["logits"] = Tolerance(1e9, 1e9)  # type: ignore[index]


def loosen_override(fx: Fixture) -> None:
    for tier in TIERS:
        fx.tolerances[tier].overrides["logits"] = Tolerance(1e9, 1e9)  # type: ignore[index]


@pytest.mark.parametrize(("edit", "backend"), [
    (cut_cases, OffAfterFirstCase()),
    (cut_cases_in_place, OffAfterFirstCase()),
    (loosen_tier, OffAfterFirstCase()),
    (replace_tolerances, OffAfterFirstCase()),
    (loosen_override, OffAtLogits()),
    (loosen_spec_override, OffAtLogits()),
], ids=lambda v: getattr(v, "__name__", type(v).__name__))
def test_an_edit_through_the_api_cannot_make_a_wrong_backend_pass(edit: Callable[[Fixture], object],
                                                                  backend: Backend) -> None:
    n_cases = len(api.load().cases)
    report = edit_and_judge(edit, backend)
    assert not report, f"{edit.__name__}: a wrong backend passed after the caller edited the fixture"
    assert report.n_failed > 0
    assert n_cases > 1 and {c.name for c in api.load().cases} <= {r.case for r in report.results}  # every case judged


def test_assigning_a_judge_input_says_the_fixture_is_read_only() -> None:
    fx = api.load()
    for name, value in (("cases", ()), ("tap_names", ()), ("tap_rows", {}), ("tolerances", {}), ("loose", ()),
                        ("root", None), ("seal", "0" * 64)):
        with pytest.raises(AttributeError, match="read-only") as caught:
            setattr(fx, name, value)
        assert len(str(caught.value).splitlines()) == 1
    with pytest.raises(TypeError):
        fx.tap_rows["logits"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError, match="read-only"):
        del fx.cases
    assert len(fx.cases) > 1 and "logits" in fx.tap_names


def test_editing_the_manifest_or_files_it_hands_out_changes_nothing() -> None:
    fx = api.load()
    manifest, files = fx.manifest, fx.files
    manifest["cases"] = manifest["cases"][:1]
    manifest["tolerances"]["fp64"]["atol"] = 1e9
    files["golden"]["fp64"] = files["golden"]["fp32"]
    assert fx.manifest["tolerances"]["fp64"]["atol"] == 1e-12 and len(fx.manifest["cases"]) == len(fx.cases) > 1
    assert fx.files["golden"]["fp64"] != fx.files["golden"]["fp32"]
    assert fx.tolerance_summary()["tiers"]["fp64"]["atol"] == 1e-12


def test_guard_a_tolerance_object_and_a_golden_array_cannot_be_edited() -> None:
    """A guard (already refused on e9bda08): a tolerance's atol, a golden array in place, a golden dict entry."""
    fx = api.load()
    with pytest.raises(AttributeError):
        fx.tolerances["fp64"].default.atol = 1e9  # type: ignore[misc]
    case = fx.cases[1].name
    with pytest.raises(ValueError, match="read-only"):
        fx.golden("fp64")[case]["logits"][...] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        fx.golden_case("fp64", case)["logits"] += 1.0
    fx.golden("fp64")[case]["logits"] = np.zeros(1)  # a fresh dict: the fixture's own is not this one
    assert not api.run(OffAtLogits(), fx, "fp64", decoding=False)


def test_a_backend_copy_is_not_a_fixture_to_judge_with() -> None:
    """`Fixture.for_backend` is a backend's private, editable copy; the judge refuses it (its cases could be cut)."""
    view = api.load().for_backend()
    view.cases = view.cases[:1]  # type: ignore[misc]  # a backend may change its own copy
    with pytest.raises(api.ParityError, match="for_backend"):
        api.run(OffAfterFirstCase(), view, "fp64", decoding=False)


PLUGIN_SUITE = """
    import numpy as np
    import pytest
    from parity_harness._fixture.manifest import TierTolerances, Tolerance
    from tests.compare.test_immutable_fixture import OffAfterFirstCase

    def test_1_edits_the_shared_fixture(parity):
        {edit}

    def test_2_a_wrong_backend_still_fails(parity):
        with pytest.raises(parity.ParityAssertionError):
            parity.assert_agrees(OffAfterFirstCase(), precision="fp64", decoding=False)
"""


@pytest.mark.parametrize("edit", [
    "parity.fixture.cases = parity.fixture.cases[:1]",
    "del parity.fixture.cases[1:]",
    'for tier in ("fp32", "fp64"): parity.fixture.tolerances[tier] = TierTolerances(Tolerance(1e9, 1e9))',
    "parity._fixture = parity.fixture.for_backend(); parity._fixture.cases = parity._fixture.cases[:1]",
], ids=["cut-cases", "cut-cases-in-place", "loosen-tier", "swap-in-a-backend-copy"])
def test_one_test_editing_the_plugin_fixture_cannot_make_another_pass(pytester: pytest.Pytester, edit: str) -> None:
    pytester.makepyfile(test_suite=textwrap.dedent(PLUGIN_SUITE).format(edit=edit))
    result = pytester.inline_run("-p", "no:cacheprovider", "-n", "0", "-p", "no:randomly")
    second = result.matchreport("test_2_a_wrong_backend_still_fails")
    assert second.passed, f"{edit}: the edit of the first test let a wrong backend pass in the second: " \
                          f"{second.longreprtext[-800:]}"


@pytest.mark.parametrize("through", ["tolerances", "spec.tolerances"])
def test_a_backend_that_forces_its_copy_s_frozen_tolerances_loosens_nothing_of_the_judge_s(through: str) -> None:
    """`object.__setattr__` on a frozen tier of the copy a backend is handed (the hostile decode-loosens-tolerances
    plugin does it): the copy's tiers, and its parsed manifest's, are its own objects."""
    fixture = api.load()
    copy = fixture.for_backend()
    tiers = copy.tolerances if through == "tolerances" else copy.spec.tolerances
    for tier in tiers.values():
        object.__setattr__(tier, "default", Tolerance(1e9, 1e9))
    assert fixture.tolerances["fp32"].default == Tolerance(1e-5, 1e-5)
    assert fixture.spec.tolerances["fp64"].default.atol == 1e-12
