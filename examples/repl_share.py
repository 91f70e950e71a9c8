"""Two unrelated Python processes sharing one dict by name.

Nothing is inherited or passed around: a second interpreter, started on its
own, attaches to the dict just by knowing its name, and sees every write.

Try it in two terminals (from the repository root)::

    # terminal 1: creates the dict and stores what you type
    python examples/repl_share.py writer mydict
    writer> greeting = 'hello'
    writer> primes = [2, 3, 5, 7]
    writer> del greeting
    writer> quit

    # terminal 2: attaches by name (waits until it exists) and prints changes
    python examples/repl_share.py reader mydict

The writer creates the dict, so it owns it (``auto_unlink=True``, the default
for a creator): when it ends -- ``quit``, an empty line, Ctrl-D, Ctrl-C or
SIGTERM -- it writes a final ``__done__`` key, which makes the reader exit,
and then unlinks the dict.  Nothing stays in /dev/shm.  Only if the writer is
killed outright (``kill -9``) do the segments stay behind; remove them with::

    python -c "from ultradict_ng import unlink_by_name; print(unlink_by_name('mydict'))"

With no arguments the script demonstrates both roles by itself: it creates a
dict, launches ``python examples/repl_share.py reader NAME`` as a separate
interpreter (``subprocess``, not ``multiprocessing``), writes a few keys while
the reader prints what it sees (its lines are shown indented, after ``|``),
checks that the reader's final view equals the dict, and cleans up::

    python examples/repl_share.py
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

try:
    import ultradict_ng  # noqa: F401
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ultradict_ng import AlreadyExists, InvalidName, NotFound, SharedDict

SENTINEL = "__done__"  # written last by the writer: "no more updates"
POLL = 0.02  # seconds between the reader's polls
FINAL = "reader: final view: "


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds normally: finally blocks and auto_unlink run


def _unlink_hint(name: str) -> str:
    return f"python -c \"from ultradict_ng import unlink_by_name; print(unlink_by_name('{name}'))\""


# -- the two roles ------------------------------------------------------------------------


def writer(name: str) -> None:
    """Interactive writer: ``key = value`` lines (Python literals, else plain strings)."""
    try:
        d = SharedDict(name=name, create=True)  # the creator: auto_unlink=True by default
    except AlreadyExists:
        raise SystemExit(
            f"a shared dict named {name!r} already exists (another writer, or left "
            f"over by a killed one).  Pick another name, or remove it with:\n  "
            f"{_unlink_hint(name)}"
        ) from None
    except InvalidName as exc:
        raise SystemExit(str(exc)) from None
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    print(f"writer: created shared dict {name!r}.  In another terminal run:")
    print(f"  python {sys.argv[0]} reader {name}")
    print("Type 'key = value' (a Python literal, else a string), 'del key', 'show';")
    print("'quit', an empty line, Ctrl-D or Ctrl-C ends and unlinks the dict.")
    print(f"(If this process is killed with -9, clean up with: {_unlink_hint(name)})")
    try:
        while True:
            try:
                line = input("writer> ").strip()
            except EOFError:
                break
            if line in ("", "quit", "exit"):
                break
            if line == "show":
                print(d.copy())
            elif line.startswith("del "):
                key = line[4:].strip()
                try:
                    del d[key]
                except KeyError:
                    print(f"no key {key!r}")
            elif "=" in line:
                key, _, text = line.partition("=")
                try:
                    value = ast.literal_eval(text.strip())
                except (ValueError, SyntaxError):
                    value = text.strip()
                try:
                    d[key.strip()] = value
                except Exception as exc:  # e.g. a value the serializer cannot store
                    print(f"not stored: {exc}")
            else:
                print("expected 'key = value', 'del key', 'show' or 'quit'")
    except KeyboardInterrupt:
        print()
    finally:
        d[SENTINEL] = True  # tells readers to stop
        d.close()  # creator + auto_unlink: the segments are removed
        print(f"writer: done; {name!r} unlinked")


def reader(name: str) -> None:
    """Attach by name (waiting for the dict to exist) and print every change."""
    waiting = False
    try:
        while True:
            try:
                d = SharedDict(name=name, create=False)  # an attacher: never unlinks
                break
            except NotFound:
                if not waiting:
                    print(f"reader: waiting for {name!r} to be created...", flush=True)
                    waiting = True
                time.sleep(0.1)
    except KeyboardInterrupt:
        return
    except InvalidName as exc:
        raise SystemExit(str(exc)) from None
    seen: dict[Any, Any] = dict(d.items())
    print(f"reader: attached to {name!r}, {len(seen)} keys: {seen}", flush=True)
    changes = 0
    try:
        while True:
            done = d.get(SENTINEL)  # read before the snapshot: the sentinel comes last
            now = dict(d.items())
            for key, value in now.items():
                if key == SENTINEL:
                    continue
                if key not in seen:
                    print(f"reader: new     {key!r} = {value!r}", flush=True)
                    changes += 1
                elif seen[key] != value:
                    print(f"reader: changed {key!r}: {seen[key]!r} -> {value!r}", flush=True)
                    changes += 1
            for key in seen.keys() - now.keys():
                print(f"reader: deleted {key!r}", flush=True)
                changes += 1
            seen = now
            if done is not None:
                break
            time.sleep(POLL)
    except KeyboardInterrupt:
        print()
    finally:
        d.close()
    seen.pop(SENTINEL, None)
    print(f"reader: saw {changes} changes, then {SENTINEL!r}; exiting", flush=True)
    print(f"{FINAL}{seen!r}", flush=True)


# -- the self-contained demo ---------------------------------------------------------------


def segments_of(name: str) -> list[str]:
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        return []
    return sorted(e for e in os.listdir(shm) if e == name or e.startswith(name + "@"))


def demo() -> None:
    name = f"repl-demo-{os.getpid()}"
    d = SharedDict(name=name, create=True)  # auto_unlink=True: we clean up by closing
    script = os.path.abspath(__file__)
    lines: list[str] = []
    attached = threading.Event()
    proc = None
    relay = None
    try:
        print(f"demo: created {name!r}; starting an unrelated interpreter:")
        print(f"demo:   {os.path.basename(sys.executable)} {os.path.relpath(script)} reader {name}")
        proc = subprocess.Popen(
            [sys.executable, script, "reader", name], stdout=subprocess.PIPE, text=True, bufsize=1
        )

        def relay_output() -> None:
            assert proc is not None and proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                print(f"    | {line}", end="", flush=True)
                if line.startswith("reader: attached"):
                    attached.set()

        relay = threading.Thread(target=relay_output, daemon=True)
        relay.start()
        deadline = time.monotonic() + 30
        while not attached.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: the reader did not attach (exit code {proc.poll()})")

        steps = [
            ("set", "greeting", "hello from the writer"),
            ("set", "primes", [2, 3, 5, 7]),
            ("set", "config", {"depth": 2, "verbose": True}),
            ("set", "progress", 1),
            ("set", "progress", 2),
            ("set", "progress", 3),
            ("del", "greeting", None),
        ]
        for op, key, value in steps:
            time.sleep(0.2)  # give the reader time to show each step
            if op == "set":
                print(f"writer: d[{key!r}] = {value!r}", flush=True)
                d[key] = value
            else:
                print(f"writer: del d[{key!r}]", flush=True)
                del d[key]
        time.sleep(0.2)
        expected = d.copy()
        print(f"writer: d[{SENTINEL!r}] = True   (tells the reader to stop)", flush=True)
        d[SENTINEL] = True

        code = proc.wait(30)
        relay.join(10)
        if code != 0:
            raise SystemExit(f"FAILED: the reader exited with code {code}")
        finals = [line[len(FINAL) :] for line in lines if line.startswith(FINAL)]
        if not finals or ast.literal_eval(finals[-1]) != expected:
            raise SystemExit(f"FAILED: the reader's final view {finals} != {expected!r}")
        print(f"demo: the reader's final view equals the writer's dict ({len(expected)} keys)")
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                if relay is not None:
                    relay.join(10)
                proc.stdout.close()
        d.close()  # the creator's close unlinks the dict
    left = segments_of(name)
    print(f"demo: closed the creator's handle -> dict unlinked; its segments left in /dev/shm: {left}")
    if left:
        raise SystemExit(f"FAILED: segments left behind: {left}")


def main() -> None:
    args = sys.argv[1:]
    if not args:
        demo()
    elif len(args) == 2 and args[0] in ("writer", "reader"):
        (writer if args[0] == "writer" else reader)(args[1])
    else:
        raise SystemExit(f"usage: python {sys.argv[0]} [writer NAME | reader NAME]")


if __name__ == "__main__":
    main()
