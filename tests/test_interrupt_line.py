"""What Ctrl-C says of the images it throws away (#49 item 3): a shard commits whole, so its decoded batches are
dropped with it; the bar showed 8/32 and the line said "0/4 shards committed". The line now says how many images
were decoded and not committed (the same command decodes them again). tests/test_operations.py stops a real run."""

from types import SimpleNamespace

from ssdgen.flows.dispatch import Dispatcher
from ssdgen.flows.inflight import Job
from ssdgen.flows.pipeline import _StatusLine

RESUME = "; run the same command to resume"


def test_the_line_says_what_was_decoded_and_not_committed():
    line = _StatusLine()
    assert line() == "interrupted before any shard ran" + RESUME
    line.done = bytearray(4)
    assert line() == "interrupted: 0/4 shards committed" + RESUME  # nothing decoded yet (still starting)
    line.uncommitted = lambda: 8
    assert line() == ("interrupted: 0/4 shards committed; 8 decoded images not committed (a shard commits whole: the "
                      "same command decodes them again)" + RESUME)
    line.done[0], line.uncommitted = 1, lambda: 1
    assert line().startswith("interrupted: 1/4 shards committed; 1 decoded image not committed (")


def _dispatcher() -> Dispatcher:
    """The dispatcher's bookkeeping alone: the handlers `_on_batch` and `_on_written` with inert parts."""
    d = object.__new__(Dispatcher)
    d.done, d.bar, d.decoded, d.settled = bytearray(2), None, 0, 0
    d.commits = d.images = d.write_n = 0
    d.write_total = d.write_max = 0.0
    d.sched = SimpleNamespace(charge=lambda job: 0.0)
    d.inflight = SimpleNamespace(finish=lambda job, **kw: None)
    d.io = SimpleNamespace(write=lambda job, now: None)
    return d


def _job(shard: int, rows: int) -> Job:
    job = Job(SimpleNamespace(id=shard), None)
    job.split([{"prompt_id": str(i)} for i in range(rows)], 4)
    job.actor = SimpleNamespace(jobs=[job])
    return job


def _back(result=None):
    return SimpleNamespace(exception=lambda: None, result=lambda: result)


def test_the_dispatcher_counts_decoded_rows_until_their_shard_commits():
    d = _dispatcher()
    a, b = _job(0, 8), _job(1, 8)
    batch = SimpleNamespace(busy_s=0.0, load_s=0.0, worker=None)
    for job in (a, b):
        d._on_batch(job, 0, 0, _back(batch))  # the first 4 rows of each shard back
    assert (d.decoded, d.uncommitted) == (8, 8)
    d._on_batch(a, 1, 0, _back(batch))
    d._on_written(a, SimpleNamespace(ok=8), 0.1)  # shard 0 committed: its rows are no longer at risk
    assert (d.decoded, d.uncommitted, d.images) == (12, 4, 8)
    d._on_batch(b, 1, 1, _back(batch))  # a late result of an older submission: not counted
    assert d.uncommitted == 4
