"""Trees: listings derived from children, labels, bare directories, path resolution, bodies and walks."""

from __future__ import annotations

import pytest

from imds.services.render.tree import Dir, body, resolve, walk


def sample() -> Dir:
    return Dir(
        [
            ("b-leaf", "value"),
            ("a-dir", Dir([("inner", "x"), ("deeper", Dir([("z", b"\x00\xff")]))])),
            ("keys", Dir([("0", Dir([("openssh-key", "ssh-ed25519 AAAA k")]))], labels={"0": "0=k"})),
            ("bare", Dir([("child", Dir([("leaf", "v")]))], bare=True)),
        ]
    )


# --- listings -------------------------------------------------------------------------------------------


def test_listing_keeps_insertion_order_and_marks_subtrees_with_a_slash():
    """One entry per line in the order given, a subtree ends in '/', and no trailing newline."""
    assert sample().listing() == "b-leaf\na-dir/\nkeys/\nbare/"


def test_a_label_replaces_the_entry_text_without_a_slash():
    """AWS lists public-keys/0 as '0=name': the label is shown as is, even for a subtree."""
    keys = sample()["keys"]
    assert isinstance(keys, Dir)
    assert keys.listing() == "0=k"
    assert keys.labels == {"0": "0=k"}


def test_a_bare_directory_lists_subtrees_without_a_slash():
    """Hollow's 2009-04-04 layout lists subtrees bare; its children keep their own style."""
    bare = sample()["bare"]
    assert isinstance(bare, Dir)
    assert bare.listing() == "child"
    child = bare["child"]
    assert isinstance(child, Dir)
    assert child.bare is False
    assert child.listing() == "leaf"


def test_an_empty_directory_lists_nothing():
    """An empty Dir has an empty listing (and an empty body)."""
    assert Dir().listing() == ""
    assert body(Dir()) == b""


def test_dir_accepts_a_mapping_and_copies_labels():
    """A Dir can be built from a mapping; the labels passed in are copied, not shared."""
    labels = {"a": "A"}
    node = Dir({"a": "1", "b": Dir()}, labels=labels)
    labels["b"] = "B"
    assert node.listing() == "A\nb/"
    assert node.bare is False


# --- resolve ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("b-leaf", "value"),
        ("b-leaf/", "value"),
        ("/b-leaf", "value"),
        ("a-dir/inner", "x"),
        ("a-dir//inner/", "x"),
        ("a-dir/deeper/z", b"\x00\xff"),
        ("keys/0/openssh-key", "ssh-ed25519 AAAA k"),
        ("bare/child/leaf", "v"),
    ],
)
def test_resolve_finds_leaves_and_ignores_empty_segments(path, expected):
    """Leading, trailing and doubled slashes do not matter: a trailing slash on a leaf is accepted."""
    assert resolve(sample(), path) == expected


def test_resolve_returns_directories_and_the_root():
    """A path to a subtree gives the Dir itself; the empty path and '/' give the root."""
    root = sample()
    assert resolve(root, "") is root
    assert resolve(root, "/") is root
    assert resolve(root, "a-dir") is root["a-dir"]
    assert resolve(root, "a-dir/") is root["a-dir"]


@pytest.mark.parametrize(
    "path",
    ["nope", "b-leaf/more", "a-dir/nope", "a-dir/inner/x", "keys/0=k", "keys/1", "..", "a-dir/..", "A-DIR/inner", "é"],
)
def test_resolve_returns_none_for_what_is_not_there(path):
    """Unknown names, paths below a leaf, labels, '..' and case variants resolve to nothing."""
    assert resolve(sample(), path) is None


# --- body ------------------------------------------------------------------------------------------------------


def test_body_of_a_dir_is_its_listing_and_a_leaf_is_its_bytes():
    """A Dir answers its listing; a str leaf is UTF-8; a bytes leaf is returned unchanged."""
    assert body(sample()) == b"b-leaf\na-dir/\nkeys/\nbare/"
    assert body("Zürich") == "Zürich".encode()
    assert body(b"\x00\xff\n") == b"\x00\xff\n"


# --- walk -----------------------------------------------------------------------------------------------------


def test_walk_visits_every_node_depth_first_in_listing_order():
    """Each (path, node) appears once, parents before children, siblings in listing order."""
    paths = [path for path, _ in walk(sample())]
    assert paths == [
        "b-leaf",
        "a-dir",
        "a-dir/inner",
        "a-dir/deeper",
        "a-dir/deeper/z",
        "keys",
        "keys/0",
        "keys/0/openssh-key",
        "bare",
        "bare/child",
        "bare/child/leaf",
    ]


def test_every_walked_path_resolves_to_the_walked_node():
    """The walk and resolve agree: resolving a walked path gives the very same node."""
    root = sample()
    for path, node in walk(root):
        assert resolve(root, path) is node


def test_walk_with_a_prefix_prepends_it():
    """The prefix is put in front of every path (used to walk a subtree in place)."""
    assert [p for p, _ in walk(Dir([("a", "1")]), "meta-data/")] == ["meta-data/a"]
