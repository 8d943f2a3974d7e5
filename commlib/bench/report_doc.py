"""The report document: sections kept as items and rendered twice, as Markdown (PNGs linked) and
as one self-contained HTML page (PNGs embedded as base64)."""
from __future__ import annotations

import base64
import html
import os


class Doc:
    """Sections rendered twice: Markdown and HTML."""

    def __init__(self):
        self.items = []

    def h(self, text, level=2):
        self.items.append(("h", level, text))

    def p(self, text):
        self.items.append(("p", text))

    def table(self, headers, rows):
        self.items.append(("table", headers, rows))

    def img(self, path, alt):
        self.items.append(("img", path, alt))

    def pre(self, text):
        self.items.append(("pre", text))

    def links(self, pairs):
        """A list of links: [(text, href relative to the report's folder)]."""
        self.items.append(("links", list(pairs)))

    def markdown(self):
        out = []
        for it in self.items:
            if it[0] == "h":
                out.append("#" * it[1] + " " + it[2])
            elif it[0] == "p":
                out.append(it[1])
            elif it[0] == "pre":
                out.append("```\n" + it[1] + "\n```")
            elif it[0] == "table":
                hdr, rows = it[1], it[2]
                lines = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
                lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            elif it[0] == "img":
                out.append(f"![{it[2]}]({os.path.basename(it[1])})")
            elif it[0] == "links":
                out.append("\n".join(f"- [{text}]({href.replace(' ', '%20')})" for text, href in it[1]))
            out.append("")
        return "\n".join(out)

    def html(self, title):
        e = html.escape
        body = []
        for it in self.items:
            if it[0] == "h":
                body.append(f"<h{it[1]}>{e(it[2])}</h{it[1]}>")
            elif it[0] == "p":
                body.append(f"<p>{e(it[1])}</p>")
            elif it[0] == "pre":
                body.append(f"<pre>{e(it[1])}</pre>")
            elif it[0] == "table":
                rows = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in it[2])
                body.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in it[1]) + "</tr>" + rows + "</table>")
            elif it[0] == "links":
                body.append("<ul>" + "".join(f'<li><a href="{e(href)}">{e(text)}</a></li>' for text, href in it[1])
                            + "</ul>")
            elif it[0] == "img":
                with open(it[1], "rb") as f:
                    b64 = base64.b64encode(f.read()).decode()
                body.append(f'<img alt="{e(it[2])}" src="data:image/png;base64,{b64}">')
        css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}"
               "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}"
               "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
               "th{background:#f0f0f0}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}"
               "pre{background:#f6f6f6;padding:0.6em;overflow-x:auto}")
        return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{e(title)}</title>"
                f"<style>{css}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
