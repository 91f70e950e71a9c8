"""One registry of workloads: how each is named and run, which targets it checks, how it reads.

A workload module ends with ``register(Workload(...))``; :mod:`perf.cli` imports
:data:`MODULES` and reads everything else from :data:`WORKLOADS`: the names,
numbers and aliases ``--only`` accepts, the contenders ``--contenders``
accepts, the order of the run, the tables, the targets and the plot panels.
A target is data (:class:`Target`: two record picks and a bound), so that the
text, the JSON and the docs say the same thing about it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .util import fmt_value, log

Record = dict[str, Any]

#: The modules that register workloads, in the order their workloads run.
MODULES = (
    "workloads",
    "big",
    "wake",
    "pool",
    "redis_backend",
    "transactions",
    "bigdict",
    "cache",
    "durable",
    "documents",
)

NG = "ultradict_ng"


@dataclass(frozen=True)
class Pick:
    """Which record: its workload, and any of case, contender and ``params`` values."""

    workload: str
    contender: Optional[str] = None
    case: Optional[str] = None
    params: tuple[tuple[str, Any], ...] = ()

    def find(self, recs: list[Record]) -> Optional[Record]:
        for r in recs:
            if r["workload"] != self.workload or r.get("note_only"):
                continue
            if self.contender is not None and r["contender"] != self.contender:
                continue
            if self.case is not None and r["case"] != self.case:
                continue
            p = r.get("params") or {}
            if all(p.get(k) == v for k, v in self.params):
                return r
        return None


def pick(workload: str, contender: Optional[str] = NG, case: Optional[str] = None, **params: Any) -> Pick:
    return Pick(workload, contender, case, tuple(sorted(params.items())))


Measure = Callable[[list[Record]], Optional[tuple[float, str]]]


@dataclass(frozen=True)
class Target:
    """A figure the run checks: ``num``'s median over ``den``'s (or ``num``'s alone) against ``need``.

    ``num`` may be a tuple of picks: the first one found is used, and a later one
    (a smaller size in quick mode) adds a caveat.  ``measure`` replaces the
    picks for a figure that is no ratio of two medians; it returns the value
    and the detail line.  ``exact``: the record's own check (``ok``) must hold.
    """

    text: str
    need: float
    num: Union[Pick, tuple[Pick, ...], None] = None
    den: Optional[Pick] = None
    at_most: bool = False
    strict: bool = False
    exact: bool = False
    unit: str = "x"
    measure: Optional[Measure] = None

    def need_text(self) -> str:
        op = ("<" if self.at_most else ">") + ("" if self.strict else "=")
        return f"{op} {self.need:g}x" if self.unit == "x" else f"{op} {fmt_value(self.need, self.unit)}"

    def passes(self, value: float) -> bool:
        if self.at_most:
            return value < self.need if self.strict else value <= self.need
        return value > self.need if self.strict else value >= self.need

    def evaluate(self, recs: list[Record], quick: bool) -> dict[str, Any]:
        row: dict[str, Any] = {"target": self.text, "need": self.need_text()}
        got = self._measure(recs)
        if got is None:
            row.update(measured=None, status="n/a", detail="not measured in this run")
            return row
        value, detail, caveat, ok = got
        if math.isnan(value):  # a measurement that failed: a miss, and no number in the JSON
            row.update(measured=None, status="MISS", detail=detail)
            return row
        row.update(measured=value, status="PASS" if self.passes(value) and ok else "MISS", detail=detail)
        if self.unit != "x":
            row["measured_text"] = fmt_value(value, self.unit)
        if caveat or quick:
            row["caveat"] = caveat or "--quick repetitions"
        return row

    def _measure(self, recs: list[Record]) -> Optional[tuple[float, str, str, bool]]:
        if self.measure is not None:
            got = self.measure(recs)
            return None if got is None else (got[0], got[1], "", True)
        picks = self.num if isinstance(self.num, tuple) else (self.num,)
        for i, p in enumerate(picks):
            r = p.find(recs) if p is not None else None
            if r is None or not r.get("median"):
                continue
            caveat = f"measured at {r['case']}, not {picks[0].case} (full mode only)" if i else ""
            ok = bool(r.get("ok")) if self.exact else True
            checked = "" if not self.exact else "; counts " + ("exact" if ok else "NOT EXACT")
            if self.den is None:
                return r["median"], f"{_name(r)} {_fmt(r)} (median of {r['n']}){checked}", caveat, ok
            d = (self.den if self.den.case else _same_case(self.den, r)).find(recs)
            if d is None or not d.get("median"):
                return None
            detail = f"{_name(r)} {_fmt(r)} vs {_name(d)} {_fmt(d)}{checked}"
            return r["median"] / d["median"], detail, caveat, ok
        return None


def _same_case(p: Pick, r: Record) -> Pick:
    return Pick(p.workload, p.contender, r["case"], p.params)


def _name(r: Record) -> str:
    return str(r.get("label") or r["contender"])


def _fmt(r: Record) -> str:
    return fmt_value(r["median"], r["unit"])


Keys = Callable[[Record], tuple[str, str]]
Panel = Callable[[Any, list[Record]], str]


@dataclass(frozen=True)
class Workload:
    """A workload of the harness.

    ``run(run, contenders)`` measures and calls ``run.record``; ``contenders`` are
    the adapters that take part (``adapters=True``: :mod:`perf.adapters`) or the
    keys of ``own`` that were chosen.  It may return the names of other workloads
    it measured too (attach and growth share their seeded dicts).  ``keys`` puts
    a record in a table block and row (default: one block, a row per case).
    ``panel`` draws its plot panel (default: bars per case and contender; None
    when ``plot`` is False).  ``labels`` names its own contenders, ``versions``
    reports their versions.
    """

    name: str
    number: int
    title: str
    run: Callable[..., Any]
    aliases: tuple[str, ...] = ()
    adapters: bool = False
    own: tuple[str, ...] = (NG,)
    labels: dict[str, str] = field(default_factory=dict)
    contender_aliases: dict[str, str] = field(default_factory=dict)
    versions: Optional[Callable[[], dict[str, str]]] = None
    targets: tuple[Target, ...] = ()
    keys: Optional[Keys] = None
    panel: Optional[Panel] = None
    plot: bool = True
    #: what the ratio column divides by: this contender's median in the same row
    ref: str = NG


WORKLOADS: dict[str, Workload] = {}
#: Workload modules that failed to import, with why.
_FAILED: dict[str, str] = {}


def register(w: Workload) -> Workload:
    if w.name in WORKLOADS or any(o.number == w.number for o in WORKLOADS.values()):
        raise ValueError(f"workload {w.name!r} ({w.number}) registered twice")
    WORKLOADS[w.name] = w
    return w


def load() -> list[Workload]:
    """Import every workload module; the workloads in number order."""
    for m in MODULES:
        if m not in _FAILED:
            try:
                importlib.import_module(f"perf.{m}")
            except Exception as exc:  # a missing peer or a broken module: the others still run
                _FAILED[m] = f"{type(exc).__name__}: {exc}"
                log(f"!!! perf.{m} did not import, its workloads are left out: {_FAILED[m]}")
    return sorted(WORKLOADS.values(), key=lambda w: w.number)


def aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for w in WORKLOADS.values():
        out.update({a: w.name for a in w.aliases})
        out[str(w.number)] = w.name
    return out


def targets(recs: list[Record], quick: bool) -> list[dict[str, Any]]:
    """The targets of every workload this run measured (one with a record), evaluated."""
    ran = {r["workload"] for r in recs}
    return [t.evaluate(recs, quick) for w in load() if w.name in ran for t in w.targets]
