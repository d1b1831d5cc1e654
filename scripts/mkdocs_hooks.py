"""MkDocs hooks for the docs site (mkdocs.yml ``hooks:``).

The pages link to files of the repository outside ``docs/`` (``../CHANGELOG.md``,
``../examples/``, ``../specs/``), which read well on a clone or a forge but are not part of the
site. A link whose target exists in the repository is rewritten to the file at ``repo_url`` when
mkdocs.yml sets one, else to its text alone; a link whose target does not exist is left as it is,
so ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_FENCE = re.compile(r"(^ *```.*?^ *```[^\n]*$)", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001 - MkDocs' signature
    """Rewrite the page's links to repository files outside the docs folder."""
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    page_dir = (docs / page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith("mailto:"):
            return match[0]
        path = (page_dir / target).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
            return match[0]  # inside the site (MkDocs checks it), or broken: left for --strict to report
        if not repo_url:
            return match["text"]
        kind = "tree" if path.is_dir() else "blob"
        return f"[{match['text']}]({repo_url}/{kind}/main/{path.relative_to(root).as_posix()}{match['anchor'] or ''})"

    # Fenced code is left alone: split() puts each fenced block at an odd index.
    parts = _FENCE.split(markdown)
    return "".join(part if i % 2 else _LINK.sub(rewrite, part) for i, part in enumerate(parts))
