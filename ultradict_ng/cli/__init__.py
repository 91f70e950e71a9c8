"""The command line: ``python -m ultradict_ng`` and ``ultradict-ng``.

Shared memory is invisible until it goes wrong; these commands answer the
questions people otherwise answer with ``ls /dev/shm`` and guesswork: which
dicts exist, who uses them, who holds the lock, what is in them, what
changes, and what can be removed safely; ``dump`` and ``load`` back a dict
up to a file and fill one from a file.  Tables for people by default,
``--json`` for scripts.  Errors are one line on stderr and exit status 1
(2 for a usage error, as argparse does).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Optional

from ..errors import NotFound, SharedDictError

__all__ = ["main", "build_parser"]

_EPILOG = """\
examples:
  ultradict-ng ls                    every dict on this machine, its users and its lock
  ultradict-ng show jobs             the contents of 'jobs' (large values by type and size)
  ultradict-ng show jobs done 42     only the keys 'done' and 42
  ultradict-ng stats jobs            sizes, dumps, stream use, blobs, lock and users
  ultradict-ng watch jobs            changes as they happen (Ctrl-C stops)
  ultradict-ng clean --dry-run       what clean would remove: dicts no live process uses
  ultradict-ng clean 'job-*'         clean only the dicts whose names match
  ultradict-ng clean '@udp*'         only the parcels of process pools that died
  ultradict-ng rm jobs               remove 'jobs' now, used or not (as unlink_by_name)
  ultradict-ng doctor                /dev/shm size and free space, compiled helper, platform
  ultradict-ng dump jobs jobs.dump   a consistent snapshot of 'jobs' (msgpack: every type round-trips)
  ultradict-ng dump jobs jobs.jsonl  the same as JSON lines, [key, value] per line (JSON types only)
  ultradict-ng load jobs jobs.dump   write the file's entries into 'jobs' (made if missing): all or none
  ultradict-ng load --replace jobs jobs.dump
                                     replace the contents of 'jobs' with the file's, at once
  ultradict-ng dump jobs - --format jsonl | gzip > jobs.jsonl.gz
                                     '-' is stdout for dump, stdin for load
  ultradict-ng show /var/lib/app/counters
                                     a dict kept in files: a PATH (it contains '/') where a NAME goes
  ultradict-ng ls /var/lib/app/counters ./cache
                                     dicts kept in files, read from their files (nothing opened)
  ultradict-ng doctor ./counters     also check that dict's files (read-only)
  ultradict-ng compact ./counters    a checkpoint now: the stream starts empty

Reading never runs code stored in a dict: pickled objects are shown by class,
never unpickled (dump and load refuse pickle dicts).  Nothing but load, rm,
clean and compact changes anything -- and, on the PATH of a dict kept in files
that was not closed cleanly, the recovery any open makes (a new checkpoint).
"""


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own."""
    parser = argparse.ArgumentParser(
        prog="ultradict-ng",
        description="Inspect, watch, back up, fill and clean the ultradict_ng shared dicts on this machine.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = command(
        "ls",
        "list every dict on this machine",
        "List every ultradict_ng dict in /dev/shm: keys, real shared-memory use, "
        "generation (full dumps so far), stream fill, serializer, creator, attached "
        "processes (alive and dead), lock holder, and damaged or orphaned segments.",
    )
    p.add_argument("--all", action="store_true", help="also name the other programs' files in /dev/shm")
    p.add_argument(
        "paths", metavar="PATH", nargs="*", help="list these dicts kept in files instead (read-only)"
    )
    p = command(
        "show",
        "print a dict's contents (or some keys)",
        "Print the contents of dict NAME, or only the given KEYs (a key is matched as a "
        "string first, then as a Python literal: 42, (1, 2)).  Large values and values "
        "JSON cannot hold are shown by type and size; nothing is unpickled.",
    )
    p.add_argument("name", metavar="NAME", help="a dict's name, or the PATH of a dict kept in files")
    p.add_argument("keys", metavar="KEY", nargs="*")
    p = command(
        "stats",
        "layout, sizes, dumps, stream, large values, lock and users of a dict",
        "Everything about dict NAME that is not its contents.",
    )
    p.add_argument("name", metavar="NAME")
    p = command(
        "watch",
        "print changes to a dict as they happen",
        "Print every change to dict NAME from now on, in order, through its change feed "
        "(--json: one JSON object per line).  Stops on Ctrl-C, when the dict is removed, "
        "after --count changes or after --timeout seconds without one.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--count", type=int, default=0, help="stop after this many changes")
    p.add_argument(
        "--timeout", type=float, default=None, help="stop after this many seconds without a change"
    )
    p = command(
        "rm",
        "remove dicts now (as unlink_by_name)",
        "Remove every segment of each NAME, whether processes still use it or not: they "
        "keep reading its last state (but large values they had not read: gone) and their "
        "writes raise Unlinked.  Exit status 1 if "
        "a NAME does not exist or is not an ultradict_ng dict.",
    )
    p.add_argument("names", metavar="NAME", nargs="+")
    p = command(
        "clean",
        "remove dicts no live process uses, orphaned segments, dead pools' parcels",
        "Remove the dicts that no live process uses any more (every attached process "
        "is dead, and no process maps it), dicts whose creator died while creating them, "
        "orphaned segments of ours, and the shared-memory parcels of "
        "ultradict_ng.futures process pools whose process died.  A dict with a live user -- "
        "even one attaching right now -- is never removed; other programs' files are never touched.",
    )
    p.add_argument(
        "patterns",
        metavar="PATTERN",
        nargs="*",
        help="only dicts (and orphans, and pool parcels) whose name matches one of these shell-style "
        "patterns, e.g. 'job-*' (default: every one)",
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be removed; change nothing")
    p = command(
        "doctor",
        "check this machine: /dev/shm, compiled helper, platform",
        "Check /dev/shm's size (warns at container-sized limits) and free space, whether the "
        "compiled helper and futex waiting are in use, and Python/OS support; with PATHs, "
        "also the files of those dicts kept in files (read-only: whether each opens "
        "cleanly or will be recovered, and what recovery would keep).  Exit status 1 "
        "if a check fails.",
    )
    p.add_argument("paths", metavar="PATH", nargs="*", help="dicts kept in files to check")
    p = command(
        "compact",
        "write a checkpoint of a dict kept in files now",
        "Dump the dict kept in PATH whole (a checkpoint: written aside, synced, renamed) and "
        "restart its stream, as its writers do when the stream fills; prints the disk space "
        "before and after.",
    )
    p.add_argument("path", metavar="PATH")
    p = command(
        "dump",
        "write a dict to a file (msgpack or JSON lines)",
        "Write a consistent snapshot of dict NAME (one atomic read) to FILE ('-': stdout), "
        "in insertion order.  msgpack (the default; .jsonl and .ndjson files default to "
        "jsonl): a header, then [key, value] per entry, in the dict's own encoding, so every "
        "value type it holds round-trips exactly.  jsonl: one JSON array [key, value] per "
        "line; only what JSON holds exactly (a tuple, bytes, a set ... is refused, naming the "
        "key).  FILE is written whole or not at all (a temporary file, renamed at the end).  "
        "Refuses pickle dicts (dumping them would run code stored in shared memory).",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("file", metavar="FILE")
    _transfer_options(p)
    p = command(
        "load",
        "write a file's entries into a dict, all or nothing",
        "Write the entries of FILE ('-': stdin), a dump of either format, into dict NAME in one "
        "transaction: all of them, or on a damaged file, a bad line or a value the dict "
        "cannot hold, none (exit 1, naming the line or entry).  Creates NAME if it does not "
        "exist (it outlives the command; a recurse dict if --recurse or the dump's header "
        "says its dict was one).  The dict's lock is held while FILE is read.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("file", metavar="FILE")
    _transfer_options(p)
    p.add_argument("--replace", action="store_true", help="clear the dict first, in the same transaction")
    p.add_argument(
        "--recurse",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create NAME as a recurse dict (nested dicts as live views), or not; "
        "on an existing dict it must agree",
    )
    p.add_argument(
        "--sync",
        choices=["always", "interval", "never"],
        default=None,
        help="create a PATH with this sync policy (default: interval); on an existing dict it must agree",
    )
    return parser, sub.choices


def _transfer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=["msgpack", "jsonl"],
        default=None,
        help="default: by FILE's extension (.jsonl, .ndjson: jsonl; else msgpack)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar (shown on stderr only when it is a terminal), and no "
        "summary on stderr (where dump to '-' puts it)",
    )


def _compact(args: argparse.Namespace) -> int:
    from . import paths, render

    out = paths.cmd_compact(args.path)
    if args.json:
        print(render.dumps(out))
    else:
        print(
            f"{out['path']}: checkpoint at generation {out['generation']}; "
            f"{render.size(out['bytes_before'])} -> {render.size(out['bytes_after'])} on disk"
        )
    return 0


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line's arguments, options anywhere among a command's values.

    Why not ``parse_args`` alone: argparse ends a positional of several
    values at the first option, so ``show PATH --json KEY`` left KEY
    unrecognized.  A command's own parser takes them intermixed
    (``parse_intermixed_args``, which the main parser cannot: it has
    subcommands)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = _build()
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    at = argv.index(args.command)  # (the main parser has no option that takes a value)
    if set(extra) & set(argv[:at]):  # (an option before the command is no command's)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return commands[args.command].parse_intermixed_args(
        argv[at + 1 :], argparse.Namespace(command=args.command)
    )


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    from . import cleaning, doctor, inspecting, transfer  # (imported late: --help stays fast)

    handlers = {
        "ls": inspecting.cmd_ls,
        "show": inspecting.cmd_show,
        "stats": inspecting.cmd_stats,
        "watch": inspecting.cmd_watch,
        "rm": cleaning.cmd_rm,
        "clean": cleaning.cmd_clean,
        "doctor": doctor.cmd_doctor,
        "dump": transfer.cmd_dump,
        "load": transfer.cmd_load,
        "compact": _compact,
    }
    # Rendering (``render.to_json``, ``json.dumps(indent=2)``'s encoder) takes
    # two or three frames a container level: a value at the codec's 500 levels
    # needs more than the default 1,000.
    _deeper(True)
    try:
        return handlers[args.command](args)
    except BrokenPipeError:  # `| head`
        return 0
    except (SharedDictError, OSError) as exc:
        print(f"ultradict-ng {args.command}: {exc}{_path_hint(args, exc)}", file=sys.stderr)
        return 1
    except RecursionError:  # (deeper than any dict holds: a file's, not ours)
        print(f"ultradict-ng {args.command}: a value nested too deep to show", file=sys.stderr)
        return 1
    finally:
        _deeper(False)


#: The recursion limit the commands run with (see ``main``).
_FRAMES = 5000
_running = [0, 0]  # (mains running now, the limit before the first)
_running_guard = threading.Lock()


def _deeper(entering: bool) -> None:
    """Raise the interpreter's recursion limit for the first of the mains
    running at once (a program may call ``main`` from several threads: the
    limit is the interpreter's), and put the program's own back after the
    last."""
    with _running_guard:
        if entering:
            if not _running[0]:
                _running[1] = sys.getrecursionlimit()
                sys.setrecursionlimit(max(_running[1], _FRAMES))
            _running[0] += 1
        else:
            _running[0] -= 1
            if not _running[0]:
                sys.setrecursionlimit(_running[1])


def _path_hint(args: argparse.Namespace, exc: BaseException) -> str:
    """Where a NAME was not found but a directory of that name is here: a
    path needs a ``/`` (``./jobs``), else it is the name of a dict in memory."""
    name = getattr(args, "name", None)
    if isinstance(exc, NotFound) and isinstance(name, str) and "/" not in name and os.path.isdir(name):
        return f" (a directory {name!r} is here: give ./{name} for the dict kept in it)"
    return ""
