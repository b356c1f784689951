"""The one place that knows which characters of a string from outside are unsafe to show.

Strings parity did not write (backend names, descriptions, install hints, `declines()` reasons,
`missing_dependencies()`, exception text, dump metadata, fields of merged JSON reports, fixture
case names, vocabulary words, provenance, mutant names) reach the terminal, Markdown, JUnit and
pictures. An escape sequence (CSI `ESC [2K`, OSC), a carriage return or a line separator (U+2028,
U+2029, NEL U+0085) in one of them can erase a line and print a fake `PASS`; a bidi override
(U+202E) reverses what a reader sees; XML 1.0 forbids most C0 controls, lone surrogates and
U+FFFE/U+FFFF even as character references, so a JUnit file holding one does not parse.

The rule, the same for every view:

- a line break or a tab (`\\n`, `\\r`, `\\v`, `\\f`, `\\x1c`-`\\x1e`, NEL, U+2028, U+2029, `\\t`)
  becomes one space;
- every other character Python does not call printable (`str.isprintable`: C0 and C1 controls,
  DEL, format characters, i.e. bidi embeddings, overrides and isolates, zero-width spaces and
  joiners, the BOM, tag characters; lone surrogates; noncharacters such as U+FFFF and unassigned
  code points), except spaces (category Zs) and private-use characters, becomes a visible escape:
  ESC is shown as the four characters `\\x1b`, U+202E as `\\u202e`.

The rule is idempotent and keeps printable text unchanged, so column alignment survives. Views
apply it where they write (docs/security.md, "Text from outside"): the terminal views per line,
JUnit over the whole element tree before it is written, Markdown per line, pictures over every text
of the figure; and `safe_streams` (installed by the CLI) applies it to everything parity prints,
as a backstop.
Imports nothing of parity's.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

# str.splitlines' line boundaries, and the tab: shown as one space.
BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029\t")
_KEPT_CATEGORIES = ("Zs", "Co")  # spaces (NBSP, U+3000, ...) and private use: not printable, but harmless
_BREAK_RUN = re.compile("[" + re.escape("".join(sorted(BREAKS))) + "]+")
# XML 1.0 section 2.2: Char ::= #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def escape_char(ch: str) -> str:
    """The visible escape of one character: '\\x1b', '\\u202e', '\\U000e0001'."""
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _unsafe(ch: str) -> bool:
    return not ch.isprintable() and unicodedata.category(ch) not in _KEPT_CATEGORIES


def safe_line(text: str) -> str:
    """`text` as one line a terminal shows as written: breaks and tabs a space, other unsafe characters escaped."""
    if text.isprintable():  # the fast path: almost every line parity prints
        return text
    return "".join(" " if ch in BREAKS else escape_char(ch) if _unsafe(ch) else ch for ch in text)


def safe_text(text: str) -> str:
    """The same rule, keeping the line feeds of a block parity wrote itself (every other break is a space)."""
    return "\n".join(safe_line(part) for part in text.split("\n"))


def one_line(text: str, limit: int = 400) -> str:
    """A message as a single printable line: each run of breaks one space, trimmed, cut to `limit` characters."""
    flat = safe_line(_BREAK_RUN.sub(" ", text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def xml_text(text: str, newlines: bool = False) -> str:
    """Text for an XML 1.0 attribute (one line) or element (`newlines`: its line feeds kept).

    The terminal rule first (a CI page shows these strings too), then anything XML 1.0 forbids is
    dropped as a second guard; ElementTree escapes `&`, `<`, `>` and quotes when it writes.
    """
    clean = safe_text(text) if newlines else safe_line(text)
    return _NOT_XML.sub("", clean)


def markdown_line(text: str) -> str:
    """One line of Markdown: the terminal rule, and '<' as '&lt;' (no raw HTML: an <img> badge is a fake PASS)."""
    return safe_line(text).replace("<", "&lt;")


def markdown_cell(text: str) -> str:
    """A table cell: also '|' as '\\|', so a name cannot add columns or a row of its own."""
    return markdown_line(text).replace("|", "\\|")


def plot_label(text: str) -> str:
    """A matplotlib label: the terminal rule, and no leading '_' (matplotlib leaves such labels out of a legend)."""
    label = safe_line(text)
    return " " + label if label.startswith("_") else label


class SafeStream:
    """A text stream that writes `safe_line` of each write, keeping only a line feed that ends it.

    `print(x)` writes `str(x)`, then the separators, then the end ("\\n") as separate writes, so a
    line feed inside `x` (a string from outside) becomes a space and cannot start a fake line.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        body = text.rstrip("\n")
        self._stream.write(safe_line(body) + text[len(body):])
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    @property
    def underlying(self) -> TextIO:
        """The stream it writes to: for a caller that sanitizes its own text and adds terminal controls
        (parity_harness/_cli/progress.py)."""
        return self._stream

    def __getattr__(self, name: str) -> object:  # encoding, isatty, fileno, ...
        return getattr(self._stream, name)


@contextmanager
def safe_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr through `SafeStream` for the duration (the CLI's backstop)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
