"""The dispatch thread's events. Everything that happens to the shard window reaches its one thread as one of
these, on one queue: a shard admitted, its rows read, a batch back from an actor, a restart probe answered, a
shard written, an abort, the stop. They are typed, not strings, so each is handled by name in one `match`
(flows.dispatch, `Dispatcher._handle`) and every handler has callers that a search finds; frozen, because an
event is a fact that is handled once and never changed. The fields are the window's own objects (flows.inflight
`Job`, flows.scheduling `Actor`), left untyped here so that this module imports none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Admit:
    """`Dispatcher.submit`: a shard enters the window, for `ticket`'s group."""
    shard: Any
    ticket: Any


@dataclass(frozen=True)
class Read:
    """An I/O thread read the shard's rows, or failed to: `fut` holds the rows or the error."""
    job: Any
    fut: Any


@dataclass(frozen=True)
class Batch:
    """Batch `i` of `job`, sent as resubmission `gen`, came back from its actor: `fut` holds the result or error."""
    job: Any
    i: int
    gen: int
    fut: Any


@dataclass(frozen=True)
class Probe:
    """A restarting actor's `info()` came back, or failed; `ref` keeps the call's ObjectRef alive until then."""
    actor: Any
    fut: Any
    ref: Any


@dataclass(frozen=True)
class Written:
    """An I/O thread wrote and committed the shard, or failed to: `fut` holds (marker or None, seconds)."""
    job: Any
    fut: Any


@dataclass(frozen=True)
class Abort:
    """`Dispatcher.interrupt` (Ctrl-C, SIGTERM): every shard alive ends with `exc`, uncommitted."""
    exc: BaseException


@dataclass(frozen=True)
class Stop:
    """`Dispatcher.close`: the last event; it ends the dispatch thread."""
