"""Template fields in hollow's Go-template subset: compile, render and apply."""

from __future__ import annotations

import pytest

from imds.errors import ConfigError
from imds.services.render.templates import apply, compile_all, compile_template

DOC = {
    "id": "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
    "facility": "ams1",
    "plan": {"slug": "c3.small", "specs": {"cpus": 8}},
    "ready": True,
    "off": False,
    "ratio": 1.5,
    "tags": ["a", "b"],
    "nothing": None,
}


def render(source: str, document=DOC) -> str:
    return compile_template("api_url", source).render(document)


def test_top_level_references_are_filled():
    """``{{.facility}}`` and ``{{.id}}`` are replaced by the document's values."""
    assert render("https://{{.facility}}.example/{{.id}}") == (
        "https://ams1.example/3f2504e0-4f89-11d3-9a0c-0305e82c3301"
    )


def test_nested_references_walk_objects():
    """``{{.plan.slug}}`` and deeper paths follow nested objects."""
    assert render("{{.plan.slug}}/{{.plan.specs.cpus}}") == "c3.small/8"


def test_whitespace_inside_the_braces_is_allowed():
    """Go accepts ``{{ .facility }}``; so does imds."""
    assert render("x-{{ .facility }}-{{\t.plan.slug\n}}") == "x-ams1-c3.small"


def test_literal_text_without_references_is_kept():
    """A template with no actions renders as itself."""
    assert render("https://metadata.example/phone-home") == "https://metadata.example/phone-home"


def test_adjacent_references_render_back_to_back():
    """No separator is invented between two references."""
    assert render("{{.facility}}{{.plan.slug}}") == "ams1c3.small"


@pytest.mark.parametrize(
    "source", ["{{.missing}}", "{{.plan.missing}}", "{{.facility.deeper}}", "{{.plan.specs.cpus.x}}", "{{.nothing}}"]
)
def test_missing_keys_render_empty(source):
    """Absent keys, paths through non-objects and nulls render as empty strings."""
    assert render(f"<{source}>") == "<>"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{.ready}}", "true"),
        ("{{.off}}", "false"),
        ("{{.ratio}}", "1.5"),
        ("{{.plan.specs.cpus}}", "8"),
        ("{{.tags}}", '["a","b"]'),
        ("{{.plan.specs}}", '{"cpus":8}'),
    ],
)
def test_non_string_values_render_as_text(source, expected):
    """Booleans lower-case, numbers as written, lists and objects as compact JSON."""
    assert render(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "{{.}}",
        "{{ . }}",
        "{{facility}}",
        "{{.facility | upper}}",
        "{{range .tags}}x{{end}}",
        "{{if .ready}}yes{{end}}",
        '{{printf "%s" .facility}}',
        "{{.plan-slug}}",
        "{{.1st}}",
        "{{.a..b}}",
        "{{$x := .facility}}",
        "{{}}",
        "{{- .facility -}}",
    ],
)
def test_unsupported_syntax_is_a_config_error_naming_the_field(source):
    """Only ``{{.field}}`` paths are supported; anything else fails at startup, naming the field."""
    with pytest.raises(ConfigError, match=r"template for phone_home_url: only \{\{\.field\}\} references"):
        compile_template("phone_home_url", source)


@pytest.mark.parametrize("source", ["https://{{.facility", "x}}", "{{.a}", "{.a}}", "{{.a}}}}", "{{{{.a}}"])
def test_unbalanced_braces_are_a_config_error(source):
    """A stray ``{{`` or ``}}`` is refused rather than served literally."""
    with pytest.raises(ConfigError, match="template for user_state_url") as caught:
        compile_template("user_state_url", source)
    assert "unbalanced" in caught.value.message or "only {{.field}} references" in caught.value.message


def test_apply_adds_only_missing_fields_and_leaves_the_document_alone():
    """A field the document already has keeps its stored value; the input is not mutated."""
    templates = compile_all({"api_url": "https://{{.facility}}.example", "phone_home_url": "https://ph/{{.id}}"})
    document = {"id": "i-1", "facility": "ams1", "api_url": "https://stored.example"}
    augmented = apply(document, templates)
    assert augmented == {
        "id": "i-1",
        "facility": "ams1",
        "api_url": "https://stored.example",
        "phone_home_url": "https://ph/i-1",
    }
    assert document == {"id": "i-1", "facility": "ams1", "api_url": "https://stored.example"}


def test_apply_keeps_a_stored_null_or_empty_value():
    """Presence of the key, not its truthiness, decides."""
    templates = compile_all({"api_url": "https://{{.facility}}.example"})
    assert apply({"api_url": None}, templates) == {"api_url": None}
    assert apply({"api_url": ""}, templates) == {"api_url": ""}


def test_apply_returns_the_same_object_when_nothing_is_missing():
    """No copy is made when no field is added."""
    document = {"api_url": "x"}
    assert apply(document, compile_all({"api_url": "y"})) is document
    assert apply(document, ()) is document


def test_templates_read_the_stored_document_not_each_other():
    """A template referring to another template field sees only the stored value."""
    templates = compile_all({"api_url": "https://api", "phone_home_url": "{{.api_url}}/phone-home"})
    assert apply({}, templates)["phone_home_url"] == "/phone-home"
    assert apply({"api_url": "https://mine"}, templates)["phone_home_url"] == "https://mine/phone-home"


def test_compile_all_keeps_each_key():
    """Each compiled template knows the field it fills."""
    templates = compile_all({"api_url": "a", "user_state_url": "{{.id}}"})
    assert [t.key for t in templates] == ["api_url", "user_state_url"]
    assert compile_all({}) == ()
