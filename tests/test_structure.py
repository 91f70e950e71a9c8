"""The package's structure holds: no import cycle, private names stay private,
one module talks to POSIX shared memory, modules stay small, the code map is true.

These read the source (``ast``), not the running package: an import inside a
function counts as much as one at the top, because it still ties the two
modules together (it is only later).  Imports under ``if TYPE_CHECKING:``
never run, but they tie the modules together for a reader and for the type
checker all the same: the cycle check counts them; the other checks do not.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from typing import Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "ultradict_ng")

#: Private names imported across modules on purpose, each with its reason.
#: (importer, source module, name)
PRIVATE_IMPORTS_ALLOWED: dict[tuple[str, str, str], str] = {}
#: At most this many private names imported across modules, documented or not: each
#: one couples two modules' internals, so they stay exceptions.
MAX_PRIVATE_IMPORTS = 15
#: Modules longer than this (lines) fail; the guideline is ~500.
MAX_LINES = 550


def module_files() -> Iterator[tuple[str, str]]:
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


MODULES: dict[str, str] = dict(module_files())
#: Compiled extension modules (their C source sits where the module would).
EXTENSIONS = {
    os.path.relpath(os.path.join(dp, fn), ROOT)[:-2].replace(os.sep, ".")
    for dp, _, fns in os.walk(PKG)
    for fn in fns
    if fn.endswith(".c")
}


def is_package(mod: str) -> bool:
    return MODULES.get(mod, "").endswith("__init__.py")


def resolve(importer: str, level: int, target: Optional[str]) -> str:
    if level == 0:
        return target or ""
    base = importer.split(".") if is_package(importer) else importer.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                return True
    return False


def imports_of(mod: str, type_checking: bool = False) -> list[tuple[str, Optional[str]]]:
    """(module imported, name imported from it or None) for every import that
    runs (with ``type_checking``: and every one under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(open(MODULES[mod]).read())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out: list[tuple[str, Optional[str]]] = []
    for node in ast.walk(tree):
        if not type_checking and _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            out.extend((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = resolve(mod, node.level, node.module)
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append((sub, None) if sub in MODULES or sub in EXTENSIONS else (source, a.name))
    return [(m, n) for m, n in out if m == "ultradict_ng" or m.startswith("ultradict_ng.")]


def private_attribute_uses(mod: str) -> list[tuple[str, str]]:
    """(module, name) for each ``alias._name`` where ``alias`` is one of our
    modules imported here: reaching into a module's privates by attribute is
    importing them all the same."""
    tree = ast.parse(open(MODULES[mod]).read())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve(mod, node.level, node.module)
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in MODULES and sub.startswith("ultradict_ng"):
                    aliases[a.asname or a.name] = sub
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            out.append((aliases[node.value.id], node.attr))
    return out


def graph(type_checking: bool = True) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for mod in MODULES:
        deps = set()
        for target, _name in imports_of(mod, type_checking):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            # Importing a package runs its __init__; a parent package's
            # __init__ importing its children is not a cycle of the child.
            if target != mod and not mod.startswith(target + "."):
                deps.add(target)
        edges[mod] = deps
    return edges


def find_cycle(edges: dict[str, set[str]]) -> Optional[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a cycle through a function-level import is found."""
    edges = graph()
    edges["ultradict_ng._shm.segment" if "ultradict_ng._shm.segment" in edges else "ultradict_ng.errors"].add(
        "ultradict_ng.shareddict"
    )
    assert find_cycle(edges) is not None


def private_imports() -> list[tuple[str, str, str]]:
    found = []
    for mod in MODULES:
        for source, name in imports_of(mod):
            if name and name.startswith("_") and not name.startswith("__"):
                found.append((mod, source, name))
        found.extend((mod, source, name) for source, name in private_attribute_uses(mod))
    return found


def test_private_names_stay_private() -> None:
    found = private_imports()
    undocumented = [f for f in found if f not in PRIVATE_IMPORTS_ALLOWED]
    assert not undocumented, f"private names imported across modules: {undocumented}"
    assert len(found) <= MAX_PRIVATE_IMPORTS


def test_one_module_calls_shm_open() -> None:
    callers = sorted(
        mod
        for mod, path in MODULES.items()
        if re.search(r"\bshm_open\s*\(|\bshm_unlink\s*\(", open(path).read())
    )
    assert len(callers) == 1, f"modules that call shm_open/shm_unlink: {callers}"


def test_every_package_is_installed() -> None:
    """A non-editable install copies only the packages pyproject.toml lists: one
    missing there imports from a checkout and fails for every user."""
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    listed = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M)
    assert listed is not None, "pyproject.toml lists no packages"
    named = set(re.findall(r'"([\w.]+)"', listed.group(1)))
    found = {
        os.path.relpath(here, ROOT).replace(os.sep, ".")
        for here, _dirs, names in os.walk(os.path.join(ROOT, "ultradict_ng"))
        if "__init__.py" in names
    }
    assert found - named == set(), f"packages missing from pyproject.toml: {sorted(found - named)}"
    assert named - found == set(), f"pyproject.toml lists packages that do not exist: {sorted(named - found)}"


def test_modules_stay_small() -> None:
    long = {mod: n for mod, path in MODULES.items() if (n := sum(1 for _ in open(path))) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_code_map_names_every_module() -> None:
    """The code map (docs/development.md, generated by docs/hooks.py from each
    module's docstring) covers every module, and every module says what it holds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(ROOT, "docs", "hooks.py"))
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    mapped = dict(hooks.code_map())
    missing = sorted(set(MODULES) - set(mapped))
    assert not missing, f"modules the code map does not name: {missing}"
    silent = sorted(mod for mod, summary in mapped.items() if not summary)
    assert not silent, f"modules without a docstring to show in the code map: {silent}"
    page = open(os.path.join(ROOT, "docs", "development.md")).read()
    assert "<!-- codemap -->" in page, "docs/development.md no longer shows the code map"


@pytest.mark.parametrize(
    "public",
    [
        "ultradict_ng",
        "ultradict_ng.aio",
        "ultradict_ng.futures",
        "ultradict_ng._shm.layout",
        "ultradict_ng.errors",
        "ultradict_ng.speedups",
        "ultradict_ng.compat",
        "ultradict_ng.shareddict",
    ],
)
def test_public_modules_keep_their_paths(public: str) -> None:
    assert public in MODULES


#: The most modules ``ultradict_ng/`` holds directly: the public ones; the
#: rest live in packages by layer (``_facade``, ``_engine``, ``_platform``,
#: ``_helper``, ``_codec``, the engines).
MAX_TOP_LEVEL = 10


def test_the_top_level_keeps_few_modules() -> None:
    top = sorted(fn for fn in os.listdir(PKG) if fn.endswith(".py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules directly in ultradict_ng/: {top}"


@pytest.mark.parametrize(
    ("former", "spec"),
    [
        ("ultradict_ng.layout", "ultradict_ng._shm.layout"),
        ("ultradict_ng.table_layout", "ultradict_ng._shm.table_layout"),
        ("ultradict_ng.cache_layout", "ultradict_ng.cache.layout"),
    ],
)
def test_the_protocol_specs_former_paths_still_import(former: str, spec: str) -> None:
    """Each spec moved beside its code; its former top-level path names the same module."""
    import importlib

    import ultradict_ng

    assert importlib.import_module(former) is importlib.import_module(spec)
    assert getattr(ultradict_ng, former.rsplit(".", 1)[1]) is importlib.import_module(spec)
