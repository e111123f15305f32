"""MkDocs hook: the manual's home page is README.md, read at build time.

docs/index.md holds no text of its own, so the site's home page and the
repository's front page cannot drift apart. The README links into the manual
as ``docs/<page>.md`` (from the repository's root); on the site the home page
sits in ``docs/`` itself, so those links lose the ``docs/`` part. Anything
else the README links to would be outside the site: the strict build reports it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: A Markdown link or image target into the manual: ``](docs/...)``.
_INTO_DOCS = re.compile(r"\]\(docs/")


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """Give ``index.md`` the README's text, its links into the manual made relative to it."""
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config["config_file_path"]).parent / "README.md"
    return _INTO_DOCS.sub("](", readme.read_text(encoding="utf-8"))
