"""Template fields applied to metadata documents (syntax and compiling: ``imds.templates``)."""

from __future__ import annotations

from imds.models import JsonObject
from imds.templates import Template, compile_template

__all__ = ["Template", "apply", "compile_all", "compile_template"]


def compile_all(sources: dict[str, str]) -> tuple[Template, ...]:
    """Compile every configured template field."""
    return tuple(compile_template(key, source) for key, source in sources.items())


def apply(document: JsonObject, templates: tuple[Template, ...]) -> JsonObject:
    """The document plus each template field it does not already have."""
    missing = [t for t in templates if t.key not in document]
    if not missing:
        return document
    augmented = dict(document)
    for template in missing:
        augmented[template.key] = template.render(document)
    return augmented

