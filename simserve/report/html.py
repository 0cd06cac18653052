"""One self-contained HTML page: inline CSS, figures as base64 data: URIs, no links out.

A page is a list of blocks, each already HTML; the helpers below escape what they are given.
"""

from __future__ import annotations

import base64
import html

import pandas as pd

from simserve.fmt import MISSING, attainment_percent, human

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1250px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.8em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.answer { font-size: 1.1em; background: #f4f8fc; border-left: 4px solid #1f77b4;
          padding: 0.6em 1em; }
pre { background: #f8f8f8; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
.scroll { overflow-x: auto; }
"""


def text(s: str) -> str:
    return html.escape(str(s))


def heading(s: str, level: int = 2) -> str:
    return f"<h{level}>{text(s)}</h{level}>"


def paragraph(s: str, cls: str | None = None) -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<p{attr}>{text(s)}</p>"


def bullets(lead: str, items: list[str]) -> str:
    """A paragraph's lead and a list of items under it."""
    return (f"<p>{text(lead)}</p><ul>" + "".join(f"<li>{text(i)}</li>" for i in items)
            + "</ul>")


def table(df: pd.DataFrame, index: bool = True) -> str:
    """A table with numbers as people read them (simserve.fmt: 11,150 not 1.115e+04)."""
    shown = attainment_percent(df).astype(object).map(human)
    return f'<div class="scroll">{shown.to_html(index=index, na_rep=MISSING, border=0)}</div>'


def figure(png: bytes, caption: str, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{text(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{text(caption)}</figcaption></figure>")


def details(summary: str, body: str) -> str:
    return f"<details><summary>{text(summary)}</summary><pre>{text(body)}</pre></details>"


def page(title: str, blocks: list[str]) -> str:
    body = "\n".join(blocks)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{text(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>{text(title)}</h1>\n{body}\n</body>\n</html>\n")
