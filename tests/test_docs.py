"""Every Python example in README.md and docs/ runs, so the docs cannot go stale.

Each page's ```python blocks are run in order, as one script, in a fresh
interpreter (a working directory of their own, a timeout): later blocks may use
what earlier ones made, as a reader trying the page would.  A block with an
``if __name__ == "__main__":`` guard is a program of its own (its spawned
children re-import it, and must not re-run the rest of the page): it runs
alone, after the page's script.  A block fails the
page's test by raising (examples check their own claims with ``assert``), by
exiting non-zero, or by leaving shared memory behind: the examples remove what
they make, as a careful user's program would.

A block that cannot run here is marked on the line before its fence, with the
reason, which the rendered page does not show::

    <!-- docs-test: skip (needs a Redis server) -->

Keep such marks rare.  Blocks fenced as anything but ``python`` (``bash``,
``text``, ``diff``) are not run.

Leftovers are found by name: every dict an example makes is named by a string
literal in the page (a dict named at random cannot be told from another
process's), and a segment in /dev/shm that appeared during the run and is named
after one of the page's strings is a leftover.  That stays right when other
tests or other people's runs create segments meanwhile (``pytest -n 2``).
Because two pages may run at once, no two pages may use the same name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")
TIMEOUT = 120  # seconds per program; the slowest runs a few spawned processes

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
#: Names given to dicts, caches and pools in the examples.
NAMED = re.compile(
    r"""(?:\bname\s*=\s*|["'](?:name|LOCATION)["']\s*:\s*|\b(?:SharedDict|SharedCache|AsyncSharedDict)\(\s*)"""
    r"""["']([\w.-]+)["']"""
)
#: Any string literal that could name a segment: what leftovers are recognised by.
LITERAL = re.compile(r"""["']([\w.-]+)["']""")


class Block(NamedTuple):
    page: str
    line: int  # of the fence in the page
    code: str
    skip: str  # why it is not run ('' when it is)


def pages() -> list[Path]:
    found = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in found if p.is_file()]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip().rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        body = textwrap.dedent(m.group("body"))
        out.append(Block(str(path.relative_to(ROOT)), line, body, skip.group("why").strip() if skip else ""))
    return out


PAGES = {str(p.relative_to(ROOT)): blocks(p) for p in pages()}
RUNNABLE = sorted(name for name, bs in PAGES.items() if any(not b.skip for b in bs))


MAIN_GUARD = re.compile(r"^if __name__ == .__main__.:", re.M)


def programs(page_blocks: list[Block]) -> list[list[Block]]:
    """What runs, in order: the page's unguarded blocks as one script, then each guarded block."""
    runnable = [b for b in page_blocks if not b.skip]
    plain = [b for b in runnable if not MAIN_GUARD.search(b.code)]
    return ([plain] if plain else []) + [[b] for b in runnable if MAIN_GUARD.search(b.code)]


def script_of(page_blocks: list[Block]) -> tuple[str, list[tuple[int, Block]]]:
    """Blocks as one script, and where each block starts in it."""
    lines: list[str] = []
    starts = []
    for b in page_blocks:
        if b.skip:
            continue
        lines.append(f"# --- {b.page}, the block at line {b.line} ---")
        starts.append((len(lines) + 1, b))
        lines.extend(b.code.rstrip("\n").split("\n"))
        lines.append("")
    return "\n".join(lines) + "\n", starts


def names_in(page_blocks: list[Block]) -> set[str]:
    """The names the page gives to dicts and caches."""
    return {n for b in page_blocks for n in NAMED.findall(b.code)}


def literals_in(page_blocks: list[Block]) -> set[str]:
    """Every string literal of the page that could be a segment's name."""
    return {n for b in page_blocks for n in LITERAL.findall(b.code)}


def shm_entries() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


def where(stderr: str, script: Path, starts: list[tuple[int, Block]]) -> str:
    """The page line of the last frame of the script in a traceback."""
    hits = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', stderr)
    if not hits:
        return ""
    n = int(hits[-1])
    for start, b in reversed(starts):
        if n >= start:
            return f" (at {b.page}, line {b.line + 1 + n - start})"
    return ""


def test_every_python_block_is_found() -> None:
    """The fence parser sees the pages' examples (a parser that found none would pass everything)."""
    assert PAGES["README.md"], "README.md has no ```python block"
    assert len(RUNNABLE) >= 10, RUNNABLE
    for page, bs in PAGES.items():
        for b in bs:
            compile(b.code, f"{page}:{b.line}", "exec") if not b.skip else None


def test_skips_are_rare_and_say_why() -> None:
    skipped = [b for bs in PAGES.values() for b in bs if b.skip]
    total = sum(len(bs) for bs in PAGES.values())
    assert len(skipped) <= max(3, total // 10), [(b.page, b.line, b.skip) for b in skipped]


def test_pages_use_distinct_names() -> None:
    """Two pages that ran at once (pytest -n 2) must not open each other's dicts."""
    owner: dict[str, str] = {}
    clashes = []
    for page, bs in PAGES.items():
        for name in names_in([b for b in bs if not b.skip]):
            if name in owner and owner[name] != page:
                clashes.append((name, owner[name], page))
            owner.setdefault(name, page)
    assert not clashes, f"names used by two pages: {clashes}"


@pytest.mark.parametrize("page", RUNNABLE)
def test_examples_run(page: str, tmp_path: Path) -> None:
    names = literals_in(PAGES[page])
    for number, program in enumerate(programs(PAGES[page])):
        run_program(page, program, names, tmp_path / f"run{number}")


def run_program(page: str, program: list[Block], names: set[str], workdir: Path) -> None:
    source, starts = script_of(program)
    workdir.mkdir()
    script = workdir / "page_examples.py"
    script.write_text(source, encoding="utf-8")
    before = shm_entries()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, 9)
        stdout, stderr = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
        new = shm_entries() - before
        leftovers = sorted(e for e in new if e.split("@", 1)[0] in names)
        for entry in leftovers:  # removed, so that one failure does not fail the next run
            try:
                os.unlink(SHM / entry)
            except FileNotFoundError:
                pass
    at = where(stderr, script, starts) or f" (the block at {program[0].page}, line {program[0].line})"
    assert not timed_out, f"{page}: examples still running after {TIMEOUT} s{at}\n{stdout}\n{stderr}"
    assert proc.returncode == 0, (
        f"{page}: the examples failed{at}, exit {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    )
    assert not leftovers, f"{page}: the examples left shared memory behind{at}: {leftovers}"
