"""Storage writes that ride out an object store's transient faults: throttling (503 SlowDown), 5xx answers,
timeouts, reset or closed connections. Every write of a run goes through `retrying` (storage.store decorates its
write methods with `retried`): markers, the lease, the config, the plan, the price, the manifest and the summary.

The client library retries too (botocore: a few attempts within a second or two), which a store that throttles
for longer outlasts: the summary and manifest of a finished run were lost that way. Here a write is tried again
with exponential backoff and full jitter (a random wait up to the current step, so drivers that were throttled
together do not come back together) until `deadline_s` has passed (SSDGEN_WRITE_DEADLINE_S, 60 s by default).
What retrying cannot fix fails at once: a full disk, no permission, a missing bucket, a lost lease (not an
OSError), a bug.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import time

# a full disk, a quota, a read-only store, no permission, a missing bucket or folder: the same next second
PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                    errno.ENOTDIR, errno.EISDIR}
NOT_TRANSIENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
FIRST_S = 0.2   # the first backoff step
CAP_S = 5.0     # the longest step


def deadline_s() -> float:
    return float(os.environ.get("SSDGEN_WRITE_DEADLINE_S", 60))


def _client_errors() -> tuple[type, ...]:
    """The HTTP client's own connection and timeout errors, which are not OSErrors (botocore, aiohttp)."""
    found: list[type] = []
    try:
        import botocore.exceptions as b
        found += [b.HTTPClientError, b.ConnectionError, b.ReadTimeoutError, b.ConnectTimeoutError]
    except ImportError:
        pass
    try:
        import aiohttp
        found += [aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError]
    except ImportError:
        pass
    return tuple(found)


def transient_io(exc: BaseException) -> bool:
    """A storage failure that may not happen again: worth another try."""
    if isinstance(exc, NOT_TRANSIENT) or (isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError) + _client_errors())


def retrying(fn, *args, deadline: float | None = None, sleep=time.sleep, **kwargs):
    """fn(*args, **kwargs), tried again after transient failures until `deadline` seconds have passed; the last
    failure is raised as it was."""
    end = time.monotonic() + (deadline_s() if deadline is None else deadline)
    step = FIRST_S
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            wait = random.uniform(0, step)
            if not transient_io(e) or time.monotonic() + wait > end:
                raise
            sleep(wait)
            step = min(CAP_S, step * 2)


def retried(method):
    """A Store method whose every call is `retrying`: the fence (the lease's check) runs again on each try."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        return retrying(method, *args, **kwargs)
    return call
