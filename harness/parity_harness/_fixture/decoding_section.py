"""The manifest's `decoding` section as pure data: its prompts, steps and taps, checked; no file is opened.

parity_harness/_fixture/decoding.py explains the section and reads its golden files; this module is what
`Fixture.decoding()` parses it with, so that the fixture and the decoding reader do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import TIERS
from parity_harness._fixture.model_spec import decode_tap_names

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

CACHE_LAYOUT = ["H", "T", "d_head"]


@dataclass(frozen=True)
class Prompt:
    name: str  # the prefix of its golden keys, "{name}/step{k}/{tap}"
    tokens: tuple[int, ...]  # the prompt, 1 <= len, len + steps <= n_ctx
    text: str = ""
    generated: tuple[int, ...] = ()  # greedy token of each step 0..N (N + 1); the first N are fed


@dataclass(frozen=True)
class DecodeRequest:
    """What a backend decodes: prefill `prompt`, then `steps` steps feeding `feed` (None: its own greedy tokens)."""

    name: str
    prompt: tuple[int, ...]
    steps: int
    feed: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Decoding:
    """A fixture's decoding section."""

    steps: int
    prompts: tuple[Prompt, ...]
    taps: tuple[str, ...]

    def requests(self) -> list[DecodeRequest]:
        """The fixture's prompts, each step fed the golden's greedy token (teacher forcing)."""
        return [DecodeRequest(p.name, p.tokens, self.steps, p.generated[: self.steps]) for p in self.prompts]


def parse_decoding_section(manifest: dict[str, Any], files_section: dict[str, Any], config: ModelConfig,
                           manifest_path: str) -> Decoding | None:
    """The manifest's `decoding` section, checked as data; None when the fixture has none."""
    raw = manifest.get("decoding")
    files = files_section.get("decoding")
    if raw is None and files is None:
        return None
    where = f"{manifest_path}: decoding"

    def fail(what: str) -> FixtureError:
        return FixtureError(f"{where}: {what}")

    if not isinstance(raw, dict) or not isinstance(files, dict):
        raise fail("needs both the 'decoding' section and files.decoding, as objects")
    for p in TIERS:
        if not isinstance(files.get(p), str):
            raise fail(f"files.decoding.{p} must name the {p} golden file")
    steps = raw.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise fail(f"steps must be a positive integer, got {steps!r}")
    if raw.get("cache_layout") != CACHE_LAYOUT:
        raise fail(f"cache_layout must be {CACHE_LAYOUT}, got {raw.get('cache_layout')!r}")
    taps = decode_tap_names(config.n_layer)
    if raw.get("taps", taps) != taps:
        raise fail(f"taps must be {taps}")
    prompts: list[Prompt] = []
    raw_prompts = raw.get("prompts")
    if not isinstance(raw_prompts, list) or not raw_prompts:
        raise fail("prompts must be a non-empty list")
    for i, entry in enumerate(raw_prompts):
        if not isinstance(entry, dict):
            raise fail(f"prompts[{i}] is not an object")
        name, tokens, generated = entry.get("name"), entry.get("tokens"), entry.get("generated")
        if not isinstance(name, str) or not name or "/" in name or name in {p.name for p in prompts}:
            raise fail(f"prompts[{i}]: name {name!r} is empty, contains '/', or is repeated")
        for what, seq, n in (("tokens", tokens, None), ("generated", generated, steps + 1)):
            ok = isinstance(seq, list) and len(seq) >= 1 and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < config.vocab_size for t in seq
            )
            if not ok or (n is not None and len(seq) != n):  # type: ignore[arg-type]
                size = f"{n} " if n is not None else ""
                raise fail(f"prompt {name!r}: {what} must be a list of {size}token ids in [0, {config.vocab_size})")
        assert isinstance(tokens, list) and isinstance(generated, list)
        if len(tokens) + steps > config.n_ctx:
            raise fail(f"prompt {name!r}: {len(tokens)} tokens + {steps} steps exceed the context ({config.n_ctx})")
        prompts.append(Prompt(name, tuple(tokens), str(entry.get("text", "")), tuple(generated)))
    return Decoding(steps, tuple(prompts), tuple(taps))


__all__ = ["CACHE_LAYOUT", "DecodeRequest", "Decoding", "Prompt", "decode_tap_names", "parse_decoding_section"]
