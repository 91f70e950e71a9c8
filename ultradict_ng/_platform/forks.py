"""What a forked child resets, and in which order: one registry.

A child made by ``fork`` starts with one thread and a copy of its parent's
memory: locks held by the parent's other threads stay held for ever, the
parent's identity word (pid + start time) is not the child's, sockets are
shared with the parent, and the dicts the parent had open are mapped but not
registered under the child's pid.  Each module that keeps such state hands
a reset function to :func:`on_fork_in_child` with the stage it belongs to.

``os.register_at_fork`` runs its ``after_in_child`` hooks in registration
order, which is import order: a hook that needs another module's reset done
first (registering the child as a user needs its new identity word and fresh
guards) would be right only by the accident of which module imported which.
Here the order is written down instead; within a stage, hooks must not
depend on each other.
"""

from __future__ import annotations

import os
from typing import Callable

__all__ = ["STAGES", "on_fork_in_child"]

#: The stages, run in this order in the child.
STAGES = (
    "identity",  # this process's identity word (pid + start time): read by every stage below
    "threads",  # mutexes, guards and per-thread lock state the parent's threads may hold
    "connections",  # sockets shared with the parent (the Redis engine's connections)
    "registrations",  # the child registers in the dicts it maps (needs identity and guards)
    "pools",  # the parent's process pools are not the child's
)

_hooks: dict[str, list[Callable[[], None]]] = {stage: [] for stage in STAGES}


def on_fork_in_child(stage: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` in every child forked from now on, at ``stage`` (see :data:`STAGES`)."""
    if stage not in _hooks:
        raise ValueError(f"unknown fork stage {stage!r}: expected one of {', '.join(STAGES)}")
    _hooks[stage].append(hook)


def _after_fork_in_child() -> None:
    for stage in STAGES:
        for hook in _hooks[stage]:
            hook()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
