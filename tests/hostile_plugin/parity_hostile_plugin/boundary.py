"""Hostile backends for the paths beside the forward run: decoding, generate, lens, check-backend, subclasses.

Each starts from the NumPy backend (the one the docs say to copy), which decodes correctly, and misbehaves
in one way. tests/backends/plugins/test_boundary.py drives them through the real entry-point discovery.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from parity_harness._backends.base import BackendOutput, Precision
from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
from parity_harness._fixture.fixture import Fixture, Tolerance


class Boom(BaseException):
    """Not an Exception."""


def zeros_like_output(out: BackendOutput) -> BackendOutput:
    return {case: {tap: np.zeros_like(a) for tap, a in taps.items()} for case, taps in out.items()}


# -- class 1: the judged code is the code the backend defines ------------------------------------


class OverridesRun(NumpyBackend):
    """Overrides the documented `run` with wrong numbers; its parent streams through `run_cases`."""

    name: ClassVar[str] = "subclass-overrides-run-wrong"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return zeros_like_output(super().run(fixture, precision))


class OverridesRunExit0(NumpyBackend):
    name: ClassVar[str] = "subclass-overrides-run-sys-exit-0"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        sys.exit(0)


class OverridesRunCasesWrong(NumpyBackend):
    name: ClassVar[str] = "subclass-overrides-run-cases-wrong"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        for case, taps in super().run_cases(fixture, precision):
            yield case, {tap: a + 1.0 for tap, a in taps.items()}


# -- class 2: decoding is guarded like the forward pass ------------------------------------------


class DecodeSysExit0(NumpyBackend):
    name: ClassVar[str] = "decode-sys-exit-0"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        sys.exit(0)


class SupportsDecodingSysExit0(NumpyBackend):
    name: ClassVar[str] = "supports-decoding-sys-exit-0"

    def supports_decoding(self, fixture: Fixture) -> bool:
        sys.exit(0)


class DecodeBaseException(NumpyBackend):
    name: ClassVar[str] = "decode-custom-baseexception"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        raise Boom("boom in decode")


class DecodeLists(NumpyBackend):
    name: ClassVar[str] = "decode-returns-lists"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        out = super().decode(fixture, precision, requests)
        return {p: {k: a.tolist() for k, a in steps.items()} for p, steps in out.items()}


class SupportsDecodingString(NumpyBackend):
    name: ClassVar[str] = "supports-decoding-returns-string"

    def supports_decoding(self, fixture: Fixture) -> Any:
        return "yes"


class DecodeLoosens(NumpyBackend):
    """Decodes correctly, after loosening every tolerance of the fixture it was handed to 1e9."""

    name: ClassVar[str] = "decode-loosens-tolerances"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        for tier in fixture.tolerances.values():
            object.__setattr__(tier, "default", Tolerance(1e9, 1e9))
            for tap in list(tier.overrides):
                tier.overrides[tap] = Tolerance(1e9, 1e9)  # type: ignore[index]  # its copy: a plain dict
        return super().decode(fixture, precision, requests)


class DecodeWrong(NumpyBackend):
    """Decodes with every logit off by 0.5: wrong at any real tolerance."""

    name: ClassVar[str] = "decode-wrong"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        out: DecodeOutput = super().decode(fixture, precision, requests)
        return {p: {k: a + 0.5 if k.endswith("/logits") else a for k, a in steps.items()} for p, steps in out.items()}


class DecodeNaN(NumpyBackend):
    """Every logit NaN: two of these "agree" on argmax, which must not be exit 0 under generate."""

    name: ClassVar[str] = "decode-nan-logits"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        out: DecodeOutput = super().decode(fixture, precision, requests)
        return {p: {k: np.full_like(a, np.nan) if k.endswith("/logits") else a for k, a in steps.items()}
                for p, steps in out.items()}


class DecodeWrongShape(NumpyBackend):
    """Its caches lose their last position: check-backend must say so."""

    name: ClassVar[str] = "decode-wrong-shape"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        out: DecodeOutput = super().decode(fixture, precision, requests)
        return {p: {k: a[:, :-1] if "cache" in k else a for k, a in steps.items()} for p, steps in out.items()}


class DecodeUnknownKey(NumpyBackend):
    name: ClassVar[str] = "decode-unknown-key"

    def decode(self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None) -> Any:
        out: DecodeOutput = super().decode(fixture, precision, requests)
        for steps in out.values():
            steps["step99/logits"] = np.zeros(1)
        return out


# -- class 4: nothing compared is never a verdict ------------------------------------------------


class NoLensTaps(NumpyBackend):
    """Produces every tap but the logit lens."""

    name: ClassVar[str] = "no-lens-taps"

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return [t for t in fixture.tap_names if not t.startswith("logit_lens.")]


class DeclinesButCrashes(NumpyBackend):
    """Declines every fixture; its run would crash, so a command that ran it anyway would say so."""

    name: ClassVar[str] = "declines-but-crashes"

    def declines(self, fixture: Fixture) -> str | None:
        return "too big for this test"

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        raise Boom("run although it declined")
