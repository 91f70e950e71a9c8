"""``ls``, ``show``, ``stats`` and ``watch``: reading dicts without changing them.

Every one reads through :mod:`ultradict_ng._shm.survey` and
:class:`~ultradict_ng.peek.Peek`: no lock taken, nothing registered, no code
from shared memory run.  ``watch`` follows the change feed of a Peek, so it
reports every change once, in order, and resyncs the same way a feed does.
"""

from __future__ import annotations

import ast
import json
import sys
import time
from argparse import Namespace
from datetime import datetime
from typing import Any, Optional

from .._platform.listing import listable
from .._platform.names import validate_name
from .._shm.feed import Feed
from .._shm.peek import Peek
from .._shm.survey import DictReport, Holder, report, survey
from ..changes import Change
from ..errors import CorruptSegment, SharedDictError
from ..futures.leftovers import ParcelReport, parcels
from . import paths, render

__all__ = ["cmd_ls", "cmd_show", "cmd_stats", "cmd_watch"]


def _holder(h: Optional[Holder], none: str = "-") -> str:
    if h is None:
        return none
    return f"{h.pid}" + ("" if h.alive else " (dead)")


def _users(rep: DictReport) -> str:
    alive = len(rep.live_users)
    dead = len(rep.users) - alive
    text = f"{alive} alive" + (f", {dead} dead" if dead else "")
    if rep.unregistered_users:
        text += f", +{rep.unregistered_users} unregistered"
    return text


def _fill(rep: DictReport) -> str:
    if rep.stream_end is None or not rep.stream_limit:
        return "-"
    return f"{100 * rep.stream_end // rep.stream_limit}% of {render.size(rep.stream_limit)}"


def cmd_ls(args: Namespace) -> int:
    if args.paths:  # dicts kept in files: read from their files, nothing opened
        found_paths: list[dict[str, Any]] = []
        for p in args.paths:  # (each listed, or its error: one path that is no dict hides no other)
            try:
                found_paths.append(paths.summary(p))
            except (SharedDictError, OSError) as exc:
                found_paths.append({"path": p, "error": str(exc)})
        status = 1 if any("error" in s for s in found_paths) else 0
        if args.json:
            print(render.dumps(found_paths))
            return status
        for s in found_paths:
            if "error" in s:
                print(f"ultradict-ng ls: {s['error']}", file=sys.stderr)
                continue
            state = "open" if s["open"] else "closed cleanly" if s["closed_cleanly"] else "needs recovery"
            print(
                f"{s['path']}  sync={s['sync']}  {render.size(s['disk_bytes'])} on disk, "
                f"{s['dumps']} dump(s), {s['blobs']} blob(s); {state}"
            )
        return status
    if render.cannot_list("ls", "use `stats NAME` with a name you know"):
        return 1
    found = survey(load_keys=True)
    pool = parcels()
    kept = [n for n, _ in found.foreign if paths.holds_dict(f"/dev/shm/{n}")]  # (directories: tmpfs dicts)
    foreign = [(n, b) for n, b in found.foreign if n not in kept]
    if args.json:
        print(
            render.dumps(
                {
                    "dicts": [d.as_json() for d in found.dicts],
                    "orphans": [o.__dict__ for o in found.orphans],
                    "parcels": [p.to_json() for p in pool],
                    "kept_in_files": [f"/dev/shm/{n}" for n in kept],
                    "foreign": {
                        "count": len(foreign),
                        "bytes": sum(b for _, b in foreign),
                        **({"names": [n for n, _ in foreign]} if args.all else {}),
                    },
                }
            )
        )
        return 0
    if not found.dicts and not found.orphans and not pool and not kept:
        print("no ultradict_ng dicts in /dev/shm")
    if found.dicts:
        rows = []
        for d in found.dicts:
            rows.append(
                [
                    d.name,
                    "?" if d.keys is None else f"{d.keys:,}",
                    render.size(d.bytes),
                    "-" if d.generation is None else str(d.generation),
                    _fill(d),
                    f"cache, {d.cache}" if d.cache else d.serializer or "-",
                    _holder(d.creator),
                    _users(d) if d.status != "damaged" else "-",
                    "free" if d.lock is None else "held by " + _holder(d.lock),
                    d.status,
                ]
            )
        print(
            render.table(
                ["NAME", "KEYS", "SHM", "GEN", "STREAM", "SERIALIZER", "CREATOR", "USERS", "LOCK", "STATUS"],
                rows,
                right=(1, 2, 3),
            )
        )
        for d in found.dicts:
            if d.problem:
                print(f"  {d.name}: {d.status}: {d.problem}")
    for o in found.orphans:
        print(
            f"orphaned segments of {o.base!r} (no control segment): {len(o.segments)} "
            f"segment(s), {render.size(o.bytes)}; `clean` removes them"
        )
    _print_parcels(pool)
    for n in kept:
        print(f"/dev/shm/{n}: a dict kept in files (on tmpfs); `ls /dev/shm/{n}` shows it")
    if foreign:
        total = sum(b for _, b in foreign)
        names = (": " + ", ".join(n for n, _ in foreign)) if args.all else " (--all lists them)"
        print(f"{len(foreign)} other file(s) in /dev/shm, {render.size(total)}, not ultradict_ng's{names}")
    return 0


def _print_parcels(pool: list[ParcelReport]) -> None:
    """One line per pool process (and status): its parcels are transient, listing them is noise."""
    groups: dict[tuple[int, str], list[ParcelReport]] = {}
    for p in pool:
        groups.setdefault((p.owner_pid, p.status), []).append(p)
    hint = {
        "abandoned": "its process is gone; `clean` removes them",
        "creating": "being written",
        "live": "in use",
        "foreign": "not ours; never touched",
    }
    for (pid, status), group in sorted(groups.items()):
        who = f"pool of pid {pid}" if pid else "pool of unknown pid"
        print(
            f"{who}: {len(group)} process-pool parcel(s), "
            f"{render.size(sum(p.bytes for p in group))}, {status} ({hint[status]})"
        )


def _open(name: str) -> Any:
    """A Peek of dict ``name`` (or of the dict kept in files at ``name``, a path), for ``with``."""
    if paths.is_path(name):
        return paths.peeking(name)
    validate_name(name)
    return Peek.open(name)


def _key(data: dict[Any, Any], text: str) -> Any:
    """The key a command-line word names: itself as a str, else a Python literal."""
    if text in data:
        return text
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise KeyError(text) from None
    try:
        if literal in data:
            return literal
    except TypeError:
        pass
    raise KeyError(text)


def cmd_show(args: Namespace) -> int:
    with _open(args.name) as peek:
        data = peek.load()
        missing = []
        if args.keys:
            chosen = {}
            for text in args.keys:
                try:
                    k = _key(data, text)
                except KeyError:
                    missing.append(text)
                    continue
                chosen[k] = data[k]
            data = chosen
        if args.json:
            print(render.dumps(render.to_json(data)))
        else:
            for line in render.text_lines(data):
                print(line)
            if not data and not missing:
                print("(empty)")
    for text in missing:
        print(f"no key {text!r} in {args.name!r}", file=sys.stderr)
    return 1 if missing else 0


def cmd_stats(args: Namespace) -> int:
    if paths.is_path(args.name):
        return _path_stats(args)
    validate_name(args.name)
    rep = report(args.name, None if listable() else [])
    if rep is None:
        with _open(args.name):  # NotFound, or CorruptSegment for a foreign segment
            pass
        raise CorruptSegment(f"{args.name!r} is not an ultradict_ng dict")
    if rep.status == "ok":
        with _open(args.name) as peek:
            try:
                peek.load()
                rep.keys = len(peek.data)
                blob_refs = peek.blob_bytes()
            except CorruptSegment as exc:
                rep.problem = str(exc)
                blob_refs = None
    else:
        blob_refs = None
    if args.json:
        out = rep.as_json()
        out["referenced_blob_bytes"] = blob_refs
        print(render.dumps(out))
        return 0
    lines = [
        ("name", rep.name),
        ("status", rep.status + (f" ({rep.problem})" if rep.problem else "")),
        ("layout", f"version {rep.layout_version}" if rep.layout_version else "-"),
        ("created", datetime.fromtimestamp(rep.created).isoformat(" ", "seconds") if rep.created else "-"),
        (
            "serializer",
            f"{rep.serializer}"
            + (", nested dicts (recurse)" if rep.recurse else "")
            + (f"; a SharedCache, values stored with {rep.cache}" if rep.cache else ""),
        ),
        ("keys", "?" if rep.keys is None else f"{rep.keys:,}"),
        ("shared memory", f"{render.size(rep.bytes)} in {len(rep.segments)} segment(s)"),
        (
            "generation",
            f"{rep.generation} (full dumps written so far)" if rep.generation is not None else "-",
        ),
        ("stream", _stream_line(rep)),
        ("dumps", f"{rep.dumps} segment(s), {render.size(rep.dump_bytes)}"),
        (
            "large values",
            f"{rep.blobs} blob segment(s), {render.size(rep.blob_bytes)}"
            + (
                f"; threshold {render.size(rep.blob_threshold)}"
                if rep.blob_threshold
                else "; never (threshold 0)"
                if rep.blob_threshold == 0
                else ""
            ),
        ),
        ("creator", _holder(rep.creator)),
        (
            "users",
            _users(rep)
            + (
                ": " + ", ".join(f"{u.pid}" + ("" if u.alive else " (dead)") for u in rep.users)
                if rep.users
                else ""
            ),
        ),
        ("lock", "free" if rep.lock is None else "held by " + _holder(rep.lock)),
        ("waiting", f"{rep.lock_waiters} process(es) for the lock, {rep.change_waiters} for a change"),
    ]
    if rep.closing is not None:
        lines.append(("being removed by", _holder(rep.closing)))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k + ':':<{width + 1}} {v}")
    return 0


def _path_stats(args: Namespace) -> int:
    """The dict's stats and its files'.  The files are looked at before the
    open: ``open``, ``users`` and ``closed_cleanly`` describe the dict as
    others left it, not as this command's own open makes it; the control
    segment's name is ``control_segment``, the directory is ``path``."""
    before = paths.summary(args.name)
    d = paths.open_dict(args.name)
    try:
        out = {k: v for k, v in d.stats().items() if k not in ("name", "users")}
    finally:
        d.close()
    out.update(before)
    if args.json:
        print(render.dumps(out))
        return 0
    width = max(map(len, out))
    for k, v in out.items():
        print(f"{k + ':':<{width + 1}} {v}")
    return 0


def _stream_line(rep: DictReport) -> str:
    if rep.stream_end is None:
        return "-"
    kind = f"growing, up to {render.size(rep.stream_size)}" if rep.stream_grows else "fixed"
    return (
        f"{render.size(rep.stream_end)} of {render.size(rep.stream_limit)} used "
        f"({_fill(rep).split(' ')[0]}), {kind}; {render.size(rep.stream_bytes)} in memory"
    )


def _change_json(change: Change) -> dict[str, Any]:
    return {
        "time": time.time(),
        "op": change.op,
        "path": [render.to_json(p) for p in change.path],
        "key": render.to_json(change.key),
        "value": render.to_json(change.value),
        "resync": change.resync,
    }


def _change_text(change: Change) -> str:
    stamp = datetime.now().strftime("%H:%M:%S.%f")[:-3]
    where = "".join(f"[{p!r}]" for p in change.path)
    mark = "  (resync)" if change.resync else ""
    if change.op == "set":
        return f"{stamp}  set     {where}[{change.key!r}] = {render.short(change.value)}{mark}"
    if change.op == "delete":
        return f"{stamp}  delete  {where}[{change.key!r}]{mark}"
    return f"{stamp}  clear   {where or '(root)'}{mark}"


def cmd_watch(args: Namespace) -> int:
    """Print changes until interrupted, ``--count`` changes, ``--timeout``
    seconds without one, or the dict's removal."""
    with _open(args.name) as peek:
        peek.load()  # start at the current state: report what happens from now on
        feed = Feed(peek)
        if not args.json:
            print(
                f"watching {args.name!r} (generation {peek.gen}, {len(peek.data):,} keys); Ctrl-C stops",
                flush=True,
            )
        seen = 0
        try:
            while True:
                for change in feed.poll():
                    line = (
                        json.dumps(_change_json(change), default=str) if args.json else _change_text(change)
                    )
                    print(line, flush=True)
                    seen += 1
                    if args.count and seen >= args.count:
                        return 0
                if feed.ended:
                    if not args.json:
                        print(f"{args.name!r} was removed", flush=True)
                    return 0
                deadline = None if args.timeout is None else time.monotonic() + args.timeout
                if not feed.wait(deadline):
                    return 0
        except KeyboardInterrupt:
            return 0
