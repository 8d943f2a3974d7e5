"""The explorer page: one self-contained HTML file (no server, network or CDN) with the template's
CSS and scripts inline and the data (commlib/explain/data.py) as a JSON script element, which the
tests read back with :func:`embedded_data`."""
from __future__ import annotations

import html
import json
import os
import re

from commlib.explain.codec import decode_case, encode_case

__all__ = ["render", "write", "embedded_data"]

_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template")
# Order matters: explorer.js uses model.js and draw.js.
_SCRIPTS = ("model.js", "draw.js", "explorer.js")
_DATA = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)


def _read(name: str) -> str:
    with open(os.path.join(_TEMPLATE, name), encoding="utf-8") as f:
        return f.read()


def render(data: dict) -> str:
    """The page's HTML for ``data`` (explorer_data's dict; its cases stored in codec.py's form)."""
    data = dict(data, cases={k: encode_case(c) for k, c in data["cases"].items()})
    # "</" never appears inside the JSON script element, so no string in the data can close it.
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(f"{data['collective']} — commlib schedule explorer")
    page = _read("explorer.html")
    for key, value in (("__STYLE__", _read("explorer.css")),
                       ("__SCRIPT__", "\n".join(_read(s) for s in _SCRIPTS)),
                       ("__TITLE__", title), ("__DATA__", blob)):
        page = page.replace(key, value)
    return page


def write(data: dict, path: str) -> str:
    """Write the page for ``data`` to ``path`` (folders made); return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(data))
    return path


def embedded_data(page: str) -> dict:
    """The data a page carries (``page``: its HTML text), as explorer_data returned it (JSON's lists
    for tuples)."""
    m = _DATA.search(page)
    if not m:
        raise ValueError("page: no explorer data in it (not a commlib explain page)")
    data = json.loads(m.group(1))  # "<\/" is JSON's own escape of "</"
    return dict(data, cases={k: decode_case(c) for k, c in data["cases"].items()})
