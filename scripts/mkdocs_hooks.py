"""MkDocs hooks (``hooks:`` in mkdocs.yml): each page's generated parts filled in from the code.

MkDocs loads this file by path, so the checkout's root is put on ``sys.path`` for ``scripts`` and
the project's packages; the parts themselves are :mod:`scripts.docs_site`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.docs_site import expand  # noqa: E402


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    """The page's Markdown with its ``<!-- generated: NAME -->`` markers replaced."""
    return expand(markdown, page.file.src_uri)
