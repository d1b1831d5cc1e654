"""A griffe extension for the docs site: ``#:`` comments document the attribute below them.

The code documents module and class attributes the way pluggy and Sphinx autodoc do, with
``#:`` comment lines right above the assignment; griffe reads only a string literal after it.
This extension turns those comment lines into the attribute's docstring (mkdocs.yml loads it).
"""

from __future__ import annotations

from typing import Any

import griffe


class CommentDocs(griffe.Extension):
    """Give an attribute without a docstring the ``#:`` comment lines right above it."""

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:  # noqa: ARG002 - node, agent
        """Read the comment block above the attribute's first line."""
        if attr.docstring is not None or attr.lineno is None:
            return
        try:
            lines = attr.parent.lines_collection[attr.parent.filepath] if attr.parent else []  # type: ignore[index]
        except (KeyError, TypeError, AttributeError):
            return
        found: list[str] = []
        index = attr.lineno - 2  # the line above, 0-based
        while index >= 0 and lines[index].lstrip().startswith("#:"):
            found.insert(0, lines[index].lstrip()[2:].strip())
            index -= 1
        if found:
            attr.docstring = griffe.Docstring("\n".join(found), lineno=index + 2, parent=attr)
