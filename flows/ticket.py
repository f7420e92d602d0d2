"""What a group task waits on: its shards in the window (`Ticket`), and which of their errors are worth a
retry (`is_transient`). A group retries when its shards failed transiently and fails at once on anything else;
the same judgement decides whether a failed write is retried in place (flows.commit)."""

from __future__ import annotations

import threading

from ssdgen.storage.retry import transient_io


def is_transient(exc: BaseException) -> bool:
    """Storage I/O and dead or unreachable actors are worth retrying; everything else is a bug or bad config."""
    import ray.exceptions as rx
    if isinstance(exc, (rx.RayActorError, rx.ActorUnavailableError, rx.ObjectLostError, rx.GetTimeoutError)):
        return True
    if isinstance(exc, rx.RayTaskError):  # an exception inside the actor: judge its cause
        return is_transient(exc.cause) if exc.cause is not None else False
    return transient_io(exc)


class Ticket:
    """A group's shards in the window: how many are still alive, what they committed, the errors they ended
    with (the first of each kind, not one per shard)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.alive = self.committed = self.images = 0
        self.errors: dict[str, BaseException] = {}

    def add(self) -> None:
        with self.cond:
            self.alive += 1

    def done(self, images: int | None, exc: BaseException | None) -> None:
        with self.cond:
            self.alive -= 1
            if exc is not None:
                kind = "transient" if is_transient(exc) else "fatal"
                self.errors.setdefault(kind, exc)
            elif images is not None:
                self.committed += 1
                self.images += images
            self.cond.notify_all()

    def wait(self) -> None:
        """Block until every shard given to this ticket is done, then raise the worst error: one that retrying
        cannot fix (the group fails at once), else a transient one (the group retries)."""
        with self.cond:
            while self.alive:
                self.cond.wait()
        for kind in ("fatal", "transient"):
            if kind in self.errors:
                raise self.errors[kind]
