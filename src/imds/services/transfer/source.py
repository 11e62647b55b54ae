"""Reading an import source item by item, in bounded memory: JSON lines, a JSON array, or a directory.

A JSON array is parsed one element at a time (``json.JSONDecoder.raw_decode`` over a
buffered read), so an 83 MB array costs about one element of memory, not the whole file
parsed at once. Every item comes with the line it starts on.

Two kinds of trouble: an item that is not valid JSON is that item's problem (``Raw.value``
is an InvalidInput; the other items go on), while input that cannot be read at all (not
UTF-8, nested too deeply for the parser, an array that does not parse) raises
``UnreadableInput`` naming the line: an import checks the whole source before writing.

Memory is bounded by ``max_item_bytes`` (the row cap), not by the data: a line or a file
longer than that is refused by its size (``Oversized``) without being held or parsed, and
so is an array element (the array then cannot be read on: ``UnreadableInput``).

::

    with open(path, "rb") as stream:
        for raw in read_stream(stream):
            print(raw.label, raw.line, raw.value)
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from imds.errors import InvalidInput, Problem
from imds.services.records.limits import flag_of

CHUNK = 1024 * 1024  # bytes read at a time (doubled while one array element is larger)
_SPACE = re.compile(r"[ \t\n\r]*")
_BOM = "\ufeff"


class Oversized(InvalidInput):
    """An item refused by its size before it was read whole (the row cap); ``instance_id`` when known."""

    def __init__(self, problems: list[Problem], instance_id: str | None = None) -> None:
        super().__init__(problems)
        self.instance_id = instance_id


def over_cap(cap: int) -> Oversized:
    """The refusal of an item longer than ``cap`` bytes, skipped unread."""
    return Oversized([Problem("item", f"is longer than {cap} bytes, more than one item may hold "
                                      f"(16 x {flag_of('max_body_bytes')}): skipped unread")])


class UnreadableInput(InvalidInput):
    """The source cannot be read at all (not UTF-8, nested too deeply, a broken array); nothing is written."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__([])
        self.message = f"{where}: {message}"


@dataclass(frozen=True, slots=True)  # an import remembers where each id was first seen: no __dict__ each
class Raw:
    """One item as read: ``label`` (``line 12``, ``item 3``, ``web-1.json``), its first ``line``, its value.

    ``value`` is the parsed JSON, or an InvalidInput when the item is not valid JSON;
    ``size`` the length of its text as read (0: not known), which batches are weighed by.
    """

    label: str
    line: int
    value: Any
    size: int = 0

    @property
    def where(self) -> str:
        """The label, with the line when the label does not say it (``item 3 (line 7)``)."""
        return self.label if self.label.startswith("line ") else f"{self.label} (line {self.line})"


def read_path(source: Path, max_item_bytes: int | None = None) -> Iterator[Raw]:
    """The items of a file (JSON lines or a JSON array) or of a directory's ``*.json`` files, in name order."""
    if source.is_dir():
        for path in sorted(source.glob("*.json")):
            if max_item_bytes is not None and path.stat().st_size > max_item_bytes:
                yield Raw(path.name, 1, over_cap(max_item_bytes))
                continue
            data = path.read_bytes()
            try:
                text = data.decode()
            except UnicodeDecodeError as exc:
                line = data.count(b"\n", 0, exc.start) + 1
                raise _not_utf8(f"{path.name} (line {line})", exc) from exc
            yield Raw(path.name, 1, _decode(text.removeprefix(_BOM), path.name), len(data))
        return
    with source.open("rb") as stream:
        yield from read_stream(stream, max_item_bytes)


def read_stream(stream: IO[bytes], max_item_bytes: int | None = None) -> Iterator[Raw]:
    """The items of a binary stream: a JSON array when its first character is ``[``, else JSON lines."""
    head = stream.read(CHUNK)
    if head.removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n").startswith(b"["):
        yield from _Array(stream, head, max_item_bytes).items()
        return
    yield from _lines(stream, head, max_item_bytes)


def _lines(stream: IO[bytes], head: bytes, cap: int | None) -> Iterator[Raw]:
    number = 0
    rest = b""
    skipping = False  # the current line went over the cap: what is left of it is dropped as it comes
    for chunk in _chunks(stream, head):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            if skipping:
                skipping = False
                yield Raw(f"line {number}", number, over_cap(cap or 0))
                continue
            yield from _line(line, number, cap)
        if cap is not None and len(rest) > cap:
            skipping, rest = True, b""
    if skipping:
        yield Raw(f"line {number + 1}", number + 1, over_cap(cap or 0))
    elif rest:
        yield from _line(rest, number + 1, cap)


def _line(line: bytes, number: int, cap: int | None) -> Iterator[Raw]:
    if cap is not None and len(line) > cap:
        yield Raw(f"line {number}", number, over_cap(cap))
        return
    try:
        text = line.decode()
    except UnicodeDecodeError as exc:
        raise _not_utf8(f"line {number}", exc, column=exc.start + 1) from exc
    if number == 1:
        text = text.removeprefix(_BOM)
    if text.strip():
        yield Raw(f"line {number}", number, _decode(text, f"line {number}"), len(line))


def _chunks(stream: IO[bytes], head: bytes) -> Iterator[bytes]:
    yield head
    while chunk := stream.read(CHUNK):
        yield chunk


def _not_utf8(place: str, exc: UnicodeDecodeError, *, column: int | None = None) -> UnreadableInput:
    data = exc.object if isinstance(exc.object, bytes) else bytes(exc.object)
    at = f" at column {column}" if column is not None else ""
    return UnreadableInput(place, f"not valid UTF-8 (byte 0x{data[exc.start]:02x}{at}): save the file as UTF-8")


def _decode(text: str, where: str) -> Any:
    """One item's JSON: the value, or InvalidInput for invalid JSON; too-deep nesting is UnreadableInput."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return InvalidInput.one("json", f"not valid JSON: {exc.msg} at column {exc.colno}")
    except RecursionError as exc:
        raise _too_deep(where) from exc


def _too_deep(where: str) -> UnreadableInput:
    return UnreadableInput(where, "nested too deeply for the JSON parser (a document is at most "
                                  "--max-document-depth levels deep)")


class _Array:
    """A JSON array read one element at a time; ``line`` is the line of ``text[pos]``."""

    def __init__(self, stream: IO[bytes], head: bytes, cap: int | None = None) -> None:
        self._stream = stream
        self._cap = cap
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._json = json.JSONDecoder()
        self._text, self._pos, self._line, self._eof = "", 0, 1, False
        self._append(head)

    def items(self) -> Iterator[Raw]:
        """Each element as a Raw labelled ``item N``; UnreadableInput when the array does not parse."""
        self._text = self._text.removeprefix(_BOM)
        self._skip_space()
        self._advance(self._pos + 1)  # the "[" (read_stream checked it)
        self._skip_space()
        if self._peek() == "]":
            self._advance(self._pos + 1)
            self._end()
            return
        number = 0
        while True:
            self._skip_space()
            number += 1
            line = self._line
            value, size = self._value(number)
            yield Raw(f"item {number}", line, value, size)
            self._skip_space()
            following = self._peek()
            if following == "]":
                self._advance(self._pos + 1)
                self._end()
                return
            if following != ",":
                shown = "the end of the input" if not following else repr(following)
                raise UnreadableInput(f"line {self._line}", f"not a valid JSON array: expected ',' or ']' after "
                                                            f"item {number}, found {shown}")
            self._advance(self._pos + 1)

    def _value(self, number: int) -> tuple[Any, int]:
        """The next element and the length of its text (characters)."""
        while True:
            try:
                value, end = self._json.raw_decode(self._text, self._pos)
            except json.JSONDecodeError as exc:
                if self._cap is not None and len(self._text) - self._pos > self._cap:
                    raise UnreadableInput(f"line {self._line}", f"item {number} is longer than {self._cap} bytes, "
                                                                "more than one item may hold: an array element is "
                                                                "read whole (use JSON lines to skip such an item)"
                                          ) from exc
                if not self._eof:  # perhaps only cut off by the buffer's end: read more and try again
                    self._fill()
                    continue
                line = self._line + self._text.count("\n", self._pos, exc.pos)
                raise UnreadableInput(f"line {line}", f"not valid JSON in item {number}: {exc.msg}") from exc
            except RecursionError as exc:
                raise _too_deep(f"line {self._line}") from exc
            if end == len(self._text) and not self._eof:  # a number may go on in the next chunk
                self._fill()
                continue
            size = end - self._pos
            self._advance(end)
            return value, size

    def _end(self) -> None:
        self._skip_space()
        if self._peek():
            raise UnreadableInput(f"line {self._line}", "not a valid JSON array: text after its closing ']'")

    def _peek(self) -> str:
        while self._pos >= len(self._text) and not self._eof:
            self._fill()
        return self._text[self._pos] if self._pos < len(self._text) else ""

    def _skip_space(self) -> None:
        while True:
            self._advance(_SPACE.match(self._text, self._pos).end())  # type: ignore[union-attr] # "*" always matches
            if self._pos < len(self._text) or self._eof:
                return
            self._fill()

    def _advance(self, to: int) -> None:
        self._line += self._text.count("\n", self._pos, to)
        self._pos = to

    def _fill(self) -> None:
        self._text, self._pos = self._text[self._pos:], 0
        # At least as much as is pending: an element larger than a chunk costs a few reads, not one per chunk.
        self._append(self._stream.read(max(CHUNK, len(self._text))))

    def _append(self, chunk: bytes) -> None:
        self._eof = not chunk
        try:
            self._text += self._decoder.decode(chunk, final=self._eof)
        except UnicodeDecodeError as exc:
            data = exc.object if isinstance(exc.object, bytes) else bytes(exc.object)
            newlines = self._text.count("\n", self._pos) + data.count(b"\n", 0, exc.start)
            raise _not_utf8(f"line {self._line + newlines}", exc) from exc
