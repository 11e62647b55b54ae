"""Reading an import source: JSON arrays element by element, line numbers, and input that cannot be read."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from imds.errors import InvalidInput
from imds.services.transfer import source
from imds.services.transfer.source import Raw, UnreadableInput, read_path, read_stream


class Counted(io.BytesIO):
    """A stream that remembers how far it has been read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.furthest = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.furthest = max(self.furthest, self.tell())
        return chunk


def items(data: bytes) -> list[Raw]:
    return list(read_stream(io.BytesIO(data)))


def big_array(count: int, size: int) -> bytes:
    return ("[\n" + ",\n".join(json.dumps({"id": f"{n}", "pad": "x" * size}) for n in range(count)) + "\n]\n").encode()


def test_an_array_is_read_one_element_at_a_time():
    """The first element comes out after about one chunk is read, not the whole array."""
    data = big_array(4000, 1000)  # about 4 MB
    stream = Counted(data)
    first = next(read_stream(stream))
    assert first.value["id"] == "0"
    assert stream.furthest <= 2 * source.CHUNK < len(data)


def test_an_arrays_memory_is_about_one_chunk():
    """Reading a 24 MB array holds a few chunks at most (a whole parse took about 7x the file)."""
    data = big_array(24000, 1000)
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_stream(io.BytesIO(data)))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 24000
    assert peak < 8 * source.CHUNK < len(data) / 2


def test_an_element_larger_than_a_chunk_is_read_whole():
    """One element of several chunks (a big userdata) is still one item."""
    data = json.dumps([{"id": "a", "userdata": "u" * (3 * source.CHUNK + 7)}, {"id": "b"}]).encode()
    found = items(data)
    assert [len(raw.value.get("userdata", "")) for raw in found] == [3 * source.CHUNK + 7, 0]
    assert [raw.label for raw in found] == ["item 1", "item 2"]


def test_array_elements_carry_their_line():
    """Labels stay ``item N``; ``where`` adds the line an element starts on."""
    found = items(b'\xef\xbb\xbf  [\n{"id": "a"},\n\n  {"id": "b",\n "x": 1}, 7\n]\n')
    assert [(raw.label, raw.line, raw.value) for raw in found] == [
        ("item 1", 2, {"id": "a"}), ("item 2", 4, {"id": "b", "x": 1}), ("item 3", 5, 7)]
    assert found[1].where == "item 2 (line 4)"
    assert items(b" [ ] ") == []


def test_json_lines_keep_their_numbers_and_bad_json_is_the_items_problem():
    """Blank lines count; an invalid line is an InvalidInput value, not the end of the input."""
    found = items(b'{"id": "a"}\n\n{oops\n{"id": "c"}')
    assert [(raw.label, raw.line) for raw in found] == [("line 1", 1), ("line 3", 3), ("line 4", 4)]
    assert isinstance(found[1].value, InvalidInput)
    assert found[1].where == "line 3"


@pytest.mark.parametrize(("data", "message"), [
    (b'{"id": "a"}\n{"id": "b\xff"}\n', "line 2: not valid UTF-8 (byte 0xff at column 10): save the file as UTF-8"),
    (b'[\n{"id": "a"},\n{"id": "\xc3("}\n]', "line 3: not valid UTF-8 (byte 0xc3): save the file as UTF-8"),
    (b'{"id": "a"}\n' + b"[" * 200_000 + b"]" * 200_000 + b"\n",
     "line 2: nested too deeply for the JSON parser (a document is at most --max-document-depth levels deep)"),
    (b"[\n" + b"[" * 200_000 + b"]" * 200_000 + b"\n]",
     "line 2: nested too deeply for the JSON parser (a document is at most --max-document-depth levels deep)"),
    (b'[\n{"id": "a"}\n{"id": "b"}]', "line 3: not a valid JSON array: expected ',' or ']' after item 1, found '{'"),
    (b'[\n{"id": "a"},\n{"id": }]', "line 3: not valid JSON in item 2: Expecting value"),
    (b'[{"id": "a"}', "line 1: not a valid JSON array: expected ',' or ']' after item 1, found the end of the input"),
    (b'[{"id": "a"}]\n{"id": "b"}', "line 2: not a valid JSON array: text after its closing ']'"),
])
def test_input_that_cannot_be_read_names_its_line(data, message):
    """Not UTF-8, too deep, a broken array: UnreadableInput naming the line (the import then writes nothing)."""
    with pytest.raises(UnreadableInput) as caught:
        items(data)
    assert caught.value.message == message


def test_a_directory_is_read_file_by_file(tmp_path):
    """Each *.json file is one item labelled by its name; a file that is not UTF-8 is named with its line."""
    (tmp_path / "b.json").write_text('{"id": "b"}')
    (tmp_path / "a.json").write_text('{"id": "a"}')
    (tmp_path / "notes.txt").write_text("ignored")
    assert [(raw.label, raw.value) for raw in read_path(tmp_path)] == [("a.json", {"id": "a"}), ("b.json", {"id": "b"})]
    (tmp_path / "c.json").write_bytes(b'{\n"id": "\xff"}')
    with pytest.raises(UnreadableInput) as caught:
        list(read_path(tmp_path))
    assert caught.value.message == "c.json (line 2): not valid UTF-8 (byte 0xff): save the file as UTF-8"
