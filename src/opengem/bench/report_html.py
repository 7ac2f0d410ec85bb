"""Small HTML building blocks for ``opengem report``: escaped tables, sections, the page shell.

Kept apart from the data loading and plotting so the page stays one self-contained file: inline CSS,
images as data: URIs, no scripts, nothing fetched, so it opens from disk with no server.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:1.6em;margin-bottom:4px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{margin-bottom:6px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:.9em}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
pre{background:#f8f8f8;border:1px solid #eee;padding:8px;overflow-x:auto;font-size:.85em}
.note{color:#8a6d3b;background:#fcf8e3;border:1px solid #faebcc;padding:6px 10px;margin:8px 0}
.muted{color:#777}img.plot{max-width:100%;height:auto;display:block;margin:8px 0}
nav a{margin-right:12px}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def fmt(x: Any, digits: int = 4) -> str:
    """Numbers for tables: fixed digits for floats, thousands separators for ints, '-' for missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 10 ** -digits):
            return f"{x:.{digits - 1}e}"
        return f"{x:,.{digits}f}"
    return str(x)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], left_cols: int = 1,
          digits: int = 4) -> str:
    """An HTML table; the first ``left_cols`` columns are labels (left-aligned, not number-formatted)."""
    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left_cols else ""
        text = esc(v) if i < left_cols or isinstance(v, str) else esc(fmt(v, digits))
        return f"<{tag}{cls}>{text}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def img(png: bytes, alt: str) -> str:
    """An <img> carrying the PNG inline; refuses bytes that are not a PNG so a broken image never ships."""
    if not png.startswith(PNG_SIGNATURE):
        raise ValueError(f"image {alt!r} is not a PNG")
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def pre(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """The whole document; ``sections`` are (id, title, inner html) in order, linked from a nav bar."""
    nav = "".join(f'<a href="#{esc(sid)}">{esc(t)}</a>' for sid, t, _ in sections)
    body = "\n".join(section(sid, t, inner) for sid, t, inner in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n"
        f"<h1>{esc(title)}</h1><p class=\"muted\">{esc(subtitle)}</p>\n<nav>{nav}</nav>\n{body}\n"
        "</body></html>\n"
    )
