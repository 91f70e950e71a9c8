"""``rm`` and ``clean``: removing dicts, and only the unused ones.

``rm`` is :func:`~ultradict_ng.unlink_by_name` for people: it removes what it
is told to, live users or not (they keep reading the last state, but for
large values they had not read; their writes raise ``Unlinked``), and says
who was still using it.  It also removes a dict
made by another layout version (``unlink_other_layout``), which nothing of
this version can otherwise read or remove -- the leftovers of an upgrade --
and a dict kept in files that cannot be opened (damaged, or of another
version): its files by name, once no live process uses it.

``clean`` removes what nobody uses any more, and nothing else: a healthy dict
only through the register's "close if unused" protocol (layout: "Users"),
which refuses while any live process is registered or maps the control
segment, even one attaching at that very moment; a dict whose creator died
before finishing it, or whose removal was interrupted; and orphaned segments
(layout: "Unlink and cleanup register", orphans); and the parcels of process
pools whose process died (layout: "Pool parcels").  It never touches another
program's files, a dict of another layout version, or one being created.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from argparse import Namespace
from typing import Any, Optional

from .._disk.files import absolute
from .._disk.layout import META_FILE, control_name
from .._disk.lifetime import remove_unfinished, remove_unopenable, unfinished
from .._platform import segments
from .._platform.listing import listable
from .._platform.names import validate_name
from .._shm.cleanup import remove_orphans, unlink_by_name, unlink_other_layout
from .._shm.control import Header, attach_control
from .._shm.mapping import Mapping
from .._shm.survey import DictReport, report, survey
from .._shm.users import free_dead, mappers, remove_if_unused
from ..errors import CorruptSegment, IncompatibleLayout, NotADict, NotFound, SharedDictError
from ..futures.leftovers import ParcelReport, remove_leftovers
from . import paths, render

__all__ = ["cmd_rm", "cmd_clean"]


def cmd_rm(args: Namespace) -> int:
    status = 0
    results = []
    for name in args.names:
        entry: dict[str, Any] = {"name": name}
        try:
            if paths.is_path(name):  # a dict kept in files: opened (recovered if need be), then removed
                try:
                    d = paths.open_dict(name)
                except (CorruptSegment, IncompatibleLayout) as exc:  # (damaged, or another version's)
                    entry.update(removed=_remove_unopenable(name, exc), bytes=None, live_users=[])
                    results.append(entry)
                    continue
                except NotFound as exc:  # (what a creation or a removal killed midway left: finished)
                    if not unfinished(absolute(name)):
                        raise
                    entry.update(removed=_remove_unopenable(name, exc), bytes=None, live_users=[])
                    results.append(entry)
                    continue
                try:
                    others = [u.pid for u in d.users() if u.alive and u.pid != os.getpid()]
                    entry.update(removed=d.unlink(), bytes=None, live_users=others)
                finally:
                    d.close()
                results.append(entry)
                continue
            validate_name(name)
            rep = report(name, load_keys=False) if listable() else None
            try:
                removed = unlink_by_name(name)
            except IncompatibleLayout:  # made by another version: removed by name
                removed = unlink_other_layout(name)
                entry["layout_version"] = rep.layout_version if rep is not None else None
        except (SharedDictError, OSError) as exc:
            entry.update(removed=0, error=str(exc))
            status = 1
        else:
            entry["removed"] = removed
            entry["bytes"] = rep.bytes if rep is not None else None
            entry["live_users"] = [p for p in (rep.live_users if rep else []) if p != os.getpid()]
            if removed == 0:
                entry["error"] = f"no shared dict named {name!r}"
                status = 1
        results.append(entry)
    if args.json:
        print(render.dumps(results))
        return status
    for e in results:
        if "error" in e:
            print(f"{e['name']}: {e['error']}", file=sys.stderr)
            continue
        freed = f" ({render.size(e['bytes'])})" if e["bytes"] is not None else ""
        what = "file(s) and segment(s)" if paths.is_path(e["name"]) else "segment(s)"
        print(f"removed {e['name']!r}: {e['removed']} {what}{freed}")
        if e["live_users"]:
            print(
                f"  it was still used by pid {', '.join(map(str, e['live_users']))}: they keep "
                "reading its last state (not large values they had not read yet), and their writes "
                "raise Unlinked"
            )
    return status


def _remove_unopenable(path: str, why: Exception) -> int:
    """``rm PATH`` of a dict that no process could open (``why``): its files
    removed by name, once its control segment -- if dead processes left
    one -- is removed as ``clean`` removes it; refused (``why`` raised) where
    the directory's ``dict.meta`` is not a dict's, or a live process uses it."""
    directory = absolute(path)
    if isinstance(why, NotADict):  # (another program's files, or not a directory: no dict to remove)
        raise NotADict(f"nothing removed: {why}") from None
    if not isinstance(why, NotFound) and (
        os.path.exists(os.path.join(directory, META_FILE)) or not isinstance(why, CorruptSegment)
    ):
        paths.describes_a_dict(directory)  # (else not a dict's directory: nothing removed)
    st = os.stat(directory)
    control = control_name(st.st_dev, st.st_ino)
    rep = report(control, load_keys=False) if segments.exists(control) else None
    if rep is not None:
        verdict = _clean_dict(rep, mappers(), False)
        if verdict["action"] != "removed":
            users = verdict.get("users")
            by = f" by pid {', '.join(map(str, users))}" if users else ""
            raise SharedDictError(
                f"{why}; and its shared memory {control} is {verdict.get('reason', 'kept')}{by}: not removed"
            )
    return remove_unfinished(directory) if isinstance(why, NotFound) else remove_unopenable(directory)


def _in_use(rep: DictReport, maps: Optional[dict[str, set[int]]]) -> list[int]:
    me = os.getpid()
    pids = set(rep.live_users)
    if maps is not None:
        pids |= maps.get(rep.name, set())
    pids.discard(me)
    return sorted(pids)


def _clean_dict(rep: DictReport, maps: Optional[dict[str, set[int]]], dry: bool) -> dict[str, Any]:
    """What clean does with one dict (see the module docstring)."""
    entry: dict[str, Any] = {
        "name": rep.name,
        "kind": "dict",
        "status": rep.status,
        "segments": len(rep.segments),
        "bytes": rep.bytes,
    }
    if rep.status in ("creating", "incompatible") or rep.layout_version is None and rep.status == "damaged":
        entry.update(action="kept", reason=rep.problem)
        return entry
    if rep.status in ("abandoned", "unlinked"):
        entry["reason"] = rep.problem
        if dry:
            entry["action"] = "would remove"
            return entry
        # Surveyed a while ago (every process's maps, the dicts before this
        # one): the name may hold a new dict since, which this must not remove.
        now = report(rep.name, load_keys=False)
        if now is None or (now.status, now.creator) != (rep.status, rep.creator):
            entry.update(action="kept", reason="it changed since it was surveyed")
            return entry
        entry["removed"] = unlink_by_name(rep.name, control=True)
        entry["action"] = "removed"
        return entry
    users = _in_use(rep, maps)
    dead = len(rep.users) - len(rep.live_users)
    if dry:
        if users:
            entry.update(action="kept", reason="in use", users=users)
        else:
            entry.update(action="would remove", reason="no live process uses it")
        if dead:
            entry["dead_users"] = dead
        return entry
    mapping = Mapping(attach_control(rep.name), None)
    try:
        token = Header.read(rep.name, mapping.words).token
        if users:  # kept: repair its register (slots of dead users)
            entry.update(action="kept", reason="in use", users=users)
            if dead:
                entry["dead_users_freed"] = free_dead(mapping.atomic)
            return entry
        verdict = remove_if_unused(rep.name, mapping, token, maps)
    finally:
        mapping.release()
    if verdict.users:
        entry.update(action="kept", reason=verdict.reason, users=verdict.users)
    else:
        entry.update(action="removed", reason="no live process used it", removed=verdict.removed)
    return entry


def _control_of(path: str) -> str:
    """The name of the shared memory of the dict kept in ``path`` ("" if no such directory)."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return control_name(st.st_dev, st.st_ino)


def cmd_clean(args: Namespace) -> int:
    if render.cannot_list("clean", "remove dicts you know with `rm NAME`"):
        return 1
    found = survey(load_keys=False)
    if args.patterns:
        # A PATH stands for its dict's shared memory (the files are not clean's).
        patterns = [_control_of(p) if paths.is_path(p) else p for p in args.patterns]

        def chosen(name: str) -> bool:
            return any(fnmatch.fnmatchcase(name, p) for p in patterns)

        found.dicts = [d for d in found.dicts if chosen(d.name)]
        found.orphans = [o for o in found.orphans if chosen(o.base)]
    maps = mappers()
    results: list[dict[str, Any]] = []
    status = 0
    for rep in found.dicts:
        try:
            results.append(_clean_dict(rep, maps, args.dry_run))
        except FileNotFoundError:
            results.append(
                {
                    "name": rep.name,
                    "kind": "dict",
                    "action": "gone",
                    "reason": "removed meanwhile by another process",
                }
            )
        except (SharedDictError, OSError) as exc:
            results.append({"name": rep.name, "kind": "dict", "action": "error", "reason": str(exc)})
            status = 1
    for orphan in found.orphans:
        entry: dict[str, Any] = {
            "name": orphan.base,
            "kind": "orphans",
            "segments": len(orphan.segments),
            "bytes": orphan.bytes,
            "reason": "segments of a dict that no longer exists",
        }
        if args.dry_run:
            entry["action"] = "would remove"
        else:
            removed = remove_orphans(orphan.base, orphan.segments)
            entry.update(action="removed" if removed else "kept", removed=removed)
            if not removed:
                entry["reason"] = "a dict was created under that name meanwhile"
        results.append(entry)
    results.extend(_clean_parcels(args))
    if args.json:
        print(render.dumps(results))
        return status
    _print_clean(results, args.dry_run)
    return status


def _clean_parcels(args: Namespace) -> list[dict[str, Any]]:
    """Parcels of dead process pools (``futures/leftovers.py``), one entry per pool
    process; with patterns, only parcels whose name matches one."""

    def chosen(name: str) -> bool:
        return not args.patterns or any(fnmatch.fnmatchcase(name, p) for p in args.patterns)

    groups: dict[int, list[ParcelReport]] = {}
    for p in remove_leftovers(dry_run=args.dry_run, chosen=chosen):
        groups.setdefault(p.owner_pid, []).append(p)
    return [
        {
            "name": f"pool of pid {pid}" if pid else "pool of unknown pid",
            "kind": "parcels",
            "segments": len(g),
            "bytes": sum(p.bytes for p in g),
            "action": "would remove" if args.dry_run else "removed",
            "reason": "process-pool parcels whose pool process is gone",
        }
        for pid, g in sorted(groups.items())
    ]


def _print_clean(results: list[dict[str, Any]], dry: bool) -> None:
    if not results:
        print("nothing to clean: no ultradict_ng segments in /dev/shm match")
        return
    rows = []
    freed = 0
    for e in results:
        kind = e.get("kind")  # (an entry removed meanwhile, or one that failed, has less to say)
        if kind == "parcels":
            what = f"{e['name']} ({e.get('segments', '?')} parcels)"
        else:
            what = e["name"] if kind in ("dict", None) else f"{e['name']}@* (orphans)"
        reason = e.get("reason") or ""
        if e.get("users"):
            reason += ": pid " + ", ".join(map(str, e["users"]))
        if e.get("dead_users_freed"):
            reason += f"; freed {e['dead_users_freed']} dead user slot(s)"
        elif e.get("dead_users"):
            reason += f"; {e['dead_users']} dead user slot(s)"
        rows.append([what, e["action"], render.size(e.get("bytes")), reason])
        if e["action"] in ("removed", "would remove"):
            freed += e.get("bytes") or 0
    print(render.table(["DICT", "ACTION", "SHM", "WHY"], rows, right=(2,)))
    verb = "would free" if dry else "freed"
    print(f"{verb} {render.size(freed)}")
