"""`parity diff` says how many taps it compared: a backend that produces one tap of 43 is not "NOTHING FLAGGED" on
the fixture, and two backends with no tap in common are exit 2 (nothing compared: one error line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar

import numpy as np
import pytest

from parity_harness._backends.base import Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._fixture.fixture import Fixture, load_fixture
from tests.helpers import TOY, assert_one_error_line, cli_with_backends


class OnlySome(NumpyBackend):
    """The NumPy reference, producing only the taps in `KEEP`."""

    name: ClassVar[str] = "fake-logits-only"
    keep: ClassVar[tuple[str, ...]] = ("logits",)

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [t for t in fixture.tap_names if t in self.keep]

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            yield case, {t: a for t, a in taps.items() if t in self.keep}


class EmbedOnly(OnlySome):
    name: ClassVar[str] = "fake-embed-only"
    keep: ClassVar[tuple[str, ...]] = ("hook_embed",)


class NumpyToo(NumpyBackend):
    name: ClassVar[str] = "fake-numpy-too"


@pytest.fixture
def parity(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    return cli_with_backends(monkeypatch, capsys, __name__, [OnlySome, EmbedOnly, NumpyToo])


def test_a_diff_of_one_shared_tap_says_it_compared_1_of_43(parity: Callable[..., tuple[int, str, str]]) -> None:
    total = len(load_fixture(TOY).tap_names)
    code, out, err = parity("diff", OnlySome.name, "numpy", "-q", "--fixture", str(TOY))
    last = out.strip().splitlines()[-1]
    assert code == 0, (out[-2000:], err)  # what was compared agrees; the line says how little that is
    assert "on every tap" not in last
    assert f"on the 1 of {total} taps both produce" in last, last
    assert f"taps compared: 1/{total} (logits); not compared: {total - 1} taps, hook_embed .. " in last, last
    assert f"({OnlySome.name} does not produce them)" in last, last


def test_a_diff_with_no_shared_tap_is_exit_2(parity: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = parity("diff", OnlySome.name, EmbedOnly.name, "-q", "--fixture", str(TOY))
    assert_one_error_line(code, out, err, "nothing was compared", "taps compared: 0/")


def test_a_full_diff_says_every_tap(parity: Callable[..., tuple[int, str, str]]) -> None:
    total = len(load_fixture(TOY).tap_names)
    code, out, err = parity("diff", "numpy", NumpyToo.name, "-q", "--fixture", str(TOY))
    last = out.strip().splitlines()[-1]
    assert code == 0, (out[-2000:], err)
    assert last.startswith("NOTHING FLAGGED on every tap") and last.endswith(f"(taps compared: {total}/{total})"), last
