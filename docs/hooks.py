"""MkDocs hooks: the pages' generated parts.

Three markers in a page's Markdown are replaced at build time, so that nothing
they stand for is ever typed by hand and left to go stale:

``<!-- perf: DIR -->``
    The benchmark results in ``perf/results/DIR/latest.json`` (a run of
    ``python -m perf --out perf/results/DIR``): the run's date and machine, its targets,
    one table per block of cases with every contender side by side, the notes
    the harness wrote, and the plot (``latest.png``), which is copied into the
    site.
``<!-- protocol: MODULE -->``
    A layout module's docstring -- the protocol's specification, written in
    reStructuredText beside the constants it describes -- rendered with
    docutils: one Markdown heading per top-level section (so the page's table
    of contents lists them), its body as HTML.
``<!-- codemap -->``
    A table of every module of the package with the first paragraph of its own
    docstring.  ``tests/test_structure.py`` checks that it names every module.

The API reference's docstrings use Sphinx roles (``:class:`X```), which
mkdocstrings passes through as text: they are dropped from the rendered page.

Nothing here imports MkDocs at module level: the tests import this file to
check the code map without MkDocs installed.
"""

from __future__ import annotations

import ast
import html
import json
import logging
import math
import os
import re
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "ultradict_ng")
RESULTS = os.path.join(ROOT, "perf", "results")
#: Where the plots go in the site.
PLOT_DIR = "assets/perf"

log = logging.getLogger("mkdocs.hooks.ultradict_ng")

PERF_MARK = re.compile(r"<!--\s*perf:\s*([\w./-]+)\s*-->")
PROTOCOL_MARK = re.compile(r"<!--\s*protocol:\s*([\w.]+)\s*-->")
CODEMAP_MARK = re.compile(r"<!--\s*codemap\s*-->")


# -- docstring text to Markdown ---------------------------------------------------------------


def _inline_rst(text: str) -> str:
    """reST inline markup as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


# -- the code map -----------------------------------------------------------------------------


def iter_modules() -> Iterator[tuple[str, str]]:
    """(dotted module name, path) of every module of the package, packages first, sorted."""
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames, key=lambda f: (f != "__init__.py", f)):
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


def module_summary(path: str) -> str:
    """The first paragraph of a module's docstring, as one line of Markdown ('' if none)."""
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    if not doc:
        return ""
    first = doc.strip().split("\n\n", 1)[0]
    first = " ".join(line.strip() for line in first.splitlines())
    first = first.rstrip(":")  # a paragraph that introduces a literal block
    return _inline_rst(first).replace("|", "\\|")


def code_map() -> list[tuple[str, str]]:
    """(module, summary) for every module: what the code map page shows."""
    return [(mod, module_summary(path)) for mod, path in iter_modules()]


def code_map_markdown() -> str:
    rows = ["| module | what it holds (its docstring's first paragraph) |", "|---|---|"]
    for mod, summary in code_map():
        rel = mod.split(".", 1)[1] if "." in mod else mod
        name = f"**`{rel}`**" if mod.count(".") <= 1 and _is_package(mod) else f"`{rel}`"
        rows.append(f"| {name} | {summary or '(no docstring)'} |")
    return "\n".join(rows) + "\n"


def _is_package(mod: str) -> bool:
    return os.path.isfile(os.path.join(ROOT, *mod.split("."), "__init__.py"))


# -- protocol pages ---------------------------------------------------------------------------

_SECTION_RULE = re.compile(r"^(=+)\s*$")


def _split_sections(doc: str) -> list[tuple[str | None, str]]:
    """Split a reST docstring at its top-level (``====``-underlined) titles.

    Returns (title, body) pairs; the text before the first title has title None.
    A ``====`` line directly under a title line of at most its length is a title;
    a table's ``===== =====`` rules contain spaces and are left alone.
    """
    lines = doc.splitlines()
    out: list[tuple[str | None, list[str]]] = [(None, [])]
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            line.strip()
            and not line.startswith(" ")
            and _SECTION_RULE.match(nxt)
            and len(nxt.strip()) >= len(line.strip())
            and (i == 0 or not lines[i - 1].strip())
        ):
            out.append((line.strip(), []))
            i += 2
            continue
        out[-1][1].append(line)
        i += 1
    return [(title, "\n".join(body).strip("\n")) for title, body in out if title or "".join(body).strip()]


def _rst_to_html(text: str, source: str) -> str:
    """reST to an HTML fragment; docutils' complaints are logged, not shown on the page."""
    import io

    from docutils import nodes
    from docutils.core import publish_parts
    from docutils.parsers.rst import roles

    def literal_role(name, rawtext, text, lineno, inliner, options=None, content=None):  # type: ignore[no-untyped-def]
        return [nodes.literal(rawtext, text.lstrip("~"))], []

    for role in ("mod", "class", "func", "meth", "attr", "data", "exc", "obj", "const"):
        roles.register_local_role(role, literal_role)
    warnings = io.StringIO()
    parts = publish_parts(
        text,
        source_path=source,
        writer_name="html5",
        settings_overrides={
            "warning_stream": warnings,
            "report_level": 2,  # what is logged
            "halt_level": 5,
            "initial_header_level": 3,
            "doctitle_xform": False,
            "embed_stylesheet": False,
            "syntax_highlight": "none",
        },
    )
    if warnings.getvalue().strip():
        # Logged at info: the docstrings live in the package, not here.  Fix them there.
        log.info("docutils on %s:\n%s", source, warnings.getvalue().strip())
    body = parts["body"]
    # docutils' own error boxes for the warnings above: dropped (they are logged).
    body = re.sub(r'<aside class="system-message">.*?</aside>', "", body, flags=re.S)
    body = re.sub(r'<div class="system-message">.*?</div>', "", body, flags=re.S)
    return body


def protocol_markdown(module: str, chunks: dict[str, str]) -> str:
    """The module's docstring as Markdown headings and placeholders for HTML (in ``chunks``)."""
    import importlib

    doc = importlib.import_module(module).__doc__ or ""
    path = module.replace(".", "/") + ".py"
    out = [
        f"*Rendered from the docstring of `{module}` (`{path}`), the specification "
        "that the constants below it in that file implement.*\n"
    ]
    for title, body in _split_sections(doc):
        if title:
            out.append(f"## {title}\n")
        key = f"<!--protocol-chunk-{len(chunks)}-->"
        chunks[key] = '<div class="protocol-spec">' + _rst_to_html(body, f"{module}.__doc__") + "</div>"
        out.append(key + "\n")
    return "\n".join(out)


# -- performance ------------------------------------------------------------------------------

TITLES = {
    "read": "1. Hot-key read",
    "write": "2. Single-key write",
    "lock": "3. Locked increment",
    "contend": "4. Locked increments, spawned processes contending",
    "latency": "5. A write visible in another process",
    "attach": "6. Attach by name in a fresh process",
    "growth": "7. Cost per operation against dict size",
    "values": "8. Large values through a second handle",
    "big": "9. Large values to another process",
    "wakeup": "10. Waking a waiter; idle waiters; the lock under contention",
    "pool": "11. The process pool",
    "redis": "12. The Redis backend",
    "transactions": "13. Transactions",
    "bigdict": "14. Big dicts",
    "cache": "15. The shared cache",
    "durable": "16. Dicts kept in files",
    "documents": "17. JSON-like values",
}
#: What the rows of workload 14 measure.
BIGDICT_METRICS = {
    "load": "load from a `dict`",
    "open": "open + first read in a fresh process",
    "random": "100k random reads",
    "hot": "the same keys again (hot)",
    "private": "private memory a reader added",
    "items": "`items()` over everything",
    "readers8": "8 readers' private memory together",
    "writes": "20k random writes, fresh process",
    "wprivate": "private memory that writer added",
    "overwrite": "100k random overwrites by the loading process (first pass)",
}
CACHE_PARTS = {
    "django": "Django cache API (dict value)",
    "plain": "`SharedCache` API",
    "cachelib": "cachelib API (Flask-Caching's backends)",
    "hit": "Hit ratio on a Zipf trace",
    "stampede": "Stampede: 8 processes miss one cold key",
}


def _ours(contender: str) -> bool:
    c = contender.lower()
    return c.startswith("ultradict_ng") or c.endswith(("ours", ":cached", "uncached", "table")) or c == "ours"


def _num(x: float) -> str:
    """3 significant digits, no exponent."""
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{digits}f}"


def fmt(value: float | None, unit: str) -> str:
    """A measured value with a unit people read at a glance."""
    if value is None:
        return "–"
    v = float(value)
    if unit in ("ops/s", "/s"):
        for div, suffix in ((1e6, "M/s"), (1e3, "k/s")):
            if abs(v) >= div:
                return _num(v / div) + " " + suffix
        return _num(v) + " /s"
    if unit in ("s", "s/op"):
        per = "/op" if unit == "s/op" else ""
        for mul, name in ((1, "s"), (1e3, "ms"), (1e6, "µs"), (1e9, "ns")):
            if abs(v) * mul >= 1 or name == "ns":
                return f"{_num(v * mul)} {name}{per}"
    if unit == "MiB":
        if abs(v) >= 1024:
            return _num(v / 1024) + " GiB"
        if 0 < abs(v) < 1:
            return _num(v * 1024) + " KiB"
        return _num(v) + " MiB"
    if unit == "ratio":
        return f"{v:.4f}"
    if unit == "count":
        return f"{v:g}"
    return f"{_num(v)} {unit}".strip()


def _cell(r: dict[str, Any]) -> str:
    """The median; the spread (min - max) as the cell's tooltip."""
    if r.get("skipped"):
        return "skipped"
    if r.get("median") is None:
        return "failed" if r.get("error") else "–"
    text = fmt(r["median"], r["unit"])
    if _ours(r["contender"]):
        text = f"<b>{text}</b>"
    if (r.get("n") or 0) > 1 and r.get("min") is not None and r.get("max") is not None:
        lo, hi = fmt(r["min"], r["unit"]), fmt(r["max"], r["unit"])
        if lo != hi:
            text = f'<span title="{lo} – {hi} over {r["n"]} repetitions">{text}</span>'
    return text


def _keys(wl: str, r: dict[str, Any]) -> tuple[str, str, str, str]:
    """(block, row, column, column label) of a record: a table per block."""
    p = r.get("params") or {}
    label = r.get("label") or r["contender"]
    if wl == "big":  # a block per kind and size: a row per contender, a column per metric
        return r["case"].split(":", 1)[0], r["contender"], p.get("metric", r["case"]), p.get("metric", "")
    if wl == "bigdict":
        metric = p.get("metric", "")
        return r["case"], BIGDICT_METRICS.get(metric, metric or r["case"]), r["contender"], label
    if wl == "cache":
        row = r["case"]
        if ":" in row and p.get("part") != "hit":
            row = row.split(":", 1)[1].strip()
        return CACHE_PARTS.get(p.get("part", ""), p.get("part", "")), row, r["contender"], label
    return "", r["case"], r["contender"], label


def workload_tables(wl: str, recs: list[dict[str, Any]]) -> str:
    """One table per block, contenders side by side (as columns, or as rows for workload 9)."""
    blocks: list[str] = []
    for r in recs:
        if _keys(wl, r)[0] not in blocks:
            blocks.append(_keys(wl, r)[0])
    out = []
    for block in blocks:
        rows: list[str] = []
        row_labels: dict[str, str] = {}
        cols: list[str] = []
        col_labels: dict[str, str] = {}
        cells: dict[tuple[str, str], dict[str, Any]] = {}
        for r in recs:
            b, row, col, col_label = _keys(wl, r)
            if b != block or r.get("note_only"):
                continue
            if row not in rows:
                rows.append(row)
                row_labels[row] = (r.get("label") or row) if wl == "big" else row
            if col not in cols:
                cols.append(col)
                col_labels[col] = col_label
            cells[(row, col)] = r

        # A column or row with nothing measured (a contender that never ran here) is left out.
        def measured(key: tuple[str, str], cells: dict[tuple[str, str], dict[str, Any]] = cells) -> bool:
            return cells.get(key, {}).get("median") is not None

        cols = [c for c in cols if any(measured((row, c)) for row in rows)]
        rows = [row for row in rows if any(measured((row, c)) for c in cols)]
        if not cols:
            continue
        if block:
            out.append(f"**{block}**\n")
        if wl == "big":
            head = [""] + [_esc(col_labels[c]) for c in cols]
        else:
            head = [""] + [_label_md(col_labels[c], c) for c in cols]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for row in rows:
            first = _inline_rst(row_labels[row]).replace("|", "\\|")
            if wl == "big" and _ours(row):
                first = f"**{first}**"
            line = [first] + [_cell(cells[(row, c)]) if (row, c) in cells else "" for c in cols]
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    return "\n".join(out)


def _label_md(label: str, contender: str) -> str:
    label = label.replace("|", "\\|")
    return f"**{label}**" if _ours(contender) else label


def targets_markdown(targets: list[dict[str, Any]]) -> str:
    rows = [t for t in targets if t.get("status") not in (None, "n/a")]
    if not rows:
        return ""
    out = ["| target | measured | | detail |", "|---|---|---|---|"]
    for t in rows:
        m = t.get("measured_text") or ("–" if t.get("measured") is None else f"{t['measured']:.3g}x")
        status = {"PASS": "met", "MISS": "**missed**"}.get(t["status"], t["status"])
        detail = t.get("detail", "")
        if t.get("caveat"):
            detail += f" ({t['caveat']})"
        out.append(f"| {_esc(t['target'])} | {m} | {status} | {_esc(detail)} |")
    return "\n".join(out) + "\n"


def _esc(text: str) -> str:
    return html.escape(str(text), quote=False).replace("|", "\\|")


def _machine(payload: dict[str, Any]) -> str:
    m = payload.get("machine") or {}
    python = str(m.get("python", "")).split(" ", 1)[0]
    started = str(payload.get("started_at", ""))[:10]
    argv = " ".join((payload.get("options") or {}).get("argv") or [])
    bits = [
        f"run of {started}" if started else "",
        f"{m.get('cpu_count')} cores ({m.get('cpu_model')})" if m.get("cpu_count") else "",
        f"Python {python}" if python else "",
        f"{payload.get('mode')} mode" if payload.get("mode") else "",
        f"{payload.get('wall_time_s'):.0f} s" if payload.get("wall_time_s") else "",
    ]
    text = ", ".join(b for b in bits if b)
    return f"*{text}; `python -m perf {argv}`*" if argv else f"*{text}*"


def perf_markdown(name: str, plots: list[tuple[str, str]]) -> str:
    """The results of one directory under perf/results as Markdown (``plots`` collects PNGs)."""
    folder = RESULTS if name in (".", "") else os.path.join(RESULTS, name)
    path = os.path.join(folder, "latest.json")
    if not os.path.isfile(path):
        log.warning("no benchmark results at %s", os.path.relpath(path, ROOT))
        return f"*No results file at `{os.path.relpath(path, ROOT)}`.*\n"
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    recs = payload.get("records") or []
    workloads: list[str] = []
    for r in recs:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    out = [_machine(payload) + "\n"]
    tgt = targets_markdown(payload.get("targets") or [])
    for wl in workloads:
        wrecs = [r for r in recs if r["workload"] == wl]
        if len(workloads) > 1:
            out.append(f"#### {TITLES.get(wl, wl)}\n")
        out.append(workload_tables(wl, wrecs))
    # The harness's notes on how it measured (versions, servers, methods).
    notes = list(payload.get("notes") or [])
    for wl in workloads:
        notes += (payload.get("section_notes") or {}).get(wl, [])
    if tgt:
        out.append("Against the targets the harness checks:\n")
        out.append(tgt)
    src = os.path.join(folder, "latest.png")
    if os.path.isfile(src):
        dest = f"{PLOT_DIR}/{'main' if name in ('.', '') else name}-latest.png"
        plots.append((src, dest))
        out.append(f"![{TITLES.get(workloads[0], name) if workloads else name}]({dest})\n")
    if notes:
        out.append('??? note "How this run measured (the harness\'s notes)"\n')
        for n in notes:
            out.append("    - " + _esc(n).replace("\n", " "))
        out.append("")
    return "\n".join(out) + "\n"


# -- MkDocs events ----------------------------------------------------------------------------

_chunks: dict[str, str] = {}
_plots: dict[str, str] = {}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    depth = page.file.src_uri.count("/")
    prefix = "../" * depth

    def perf(m: re.Match[str]) -> str:
        plots: list[tuple[str, str]] = []
        text = perf_markdown(m.group(1), plots)
        for src, dest in plots:
            _plots[dest] = src
            text = text.replace(f"]({dest})", f"]({prefix}{dest})")
        return text

    markdown = PERF_MARK.sub(perf, markdown)
    markdown = PROTOCOL_MARK.sub(lambda m: protocol_markdown(m.group(1), _chunks), markdown)
    markdown = CODEMAP_MARK.sub(lambda m: code_map_markdown(), markdown)
    return markdown


#: A Sphinx role before inline code in a rendered docstring (``:class:`X``` reaches the
#: page as ``:class:<code>X</code>``): the role is dropped, and so is a leading ``~``.
SPHINX_ROLE = re.compile(r":(?:class|mod|meth|func|attr|data|exc|obj|const):(<code>)~?")


def on_page_content(html_text: str, page: Any, config: Any, files: Any) -> str:
    for key, chunk in _chunks.items():
        if key in html_text:
            html_text = html_text.replace(key, chunk)
    return SPHINX_ROLE.sub(r"\1", html_text)


def on_files(files: Any, config: Any) -> Any:
    """Every plot under perf/results becomes a file of the site (the pages link them)."""
    from mkdocs.structure.files import File

    for dirpath, _, filenames in os.walk(RESULTS):
        for fn in sorted(filenames):
            if fn.endswith(".png"):
                rel = os.path.relpath(dirpath, RESULTS)
                dest = f"{PLOT_DIR}/{'main' if rel == '.' else rel}-{fn}"
                with open(os.path.join(dirpath, fn), "rb") as f:
                    files.append(File.generated(config, dest, content=f.read()))
    return files
