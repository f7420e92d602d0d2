"""`--incremental` without a run (#36 item 4): the segmented shard plan (inputs/shards.py) keeps every shard where
it was when the inputs grow, and the rows added are found, and changed or removed rows refused in one line
naming them, from the recorded row digests (inputs/growth.py). The real runs are in test_incremental_runs.py."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssdgen.inputs.files import InputError, InputFile, list_inputs, with_identities
from ssdgen.inputs.growth import CHUNK, added_rows, digests_for, row_digests
from ssdgen.inputs.shards import Shards, recorded_segments, shard_count


def _fake(url: str, rows: int) -> InputFile:
    return InputFile(url=url, num_rows=rows, row_groups=(rows,), size=rows, has_prompt_id=False, has_seed=False)


def _by_url(plan: Shards) -> list[list[tuple[str, int, int]]]:
    """Every shard as (file URL, start, stop) pieces: what a shard reads, whatever the files' order."""
    return [[(plan.files[p.file].url, p.start, p.stop) for p in plan[i].pieces] for i in range(len(plan))]


def test_a_grown_plan_keeps_every_old_shard_and_numbers_the_added_rows_after_them():
    before = [_fake("s3://b/a", 5), _fake("s3://b/b", 3)]
    old = Shards(before, 4)
    assert _by_url(old) == [[("s3://b/a", 0, 4)], [("s3://b/a", 4, 5), ("s3://b/b", 0, 3)]]
    # a grew by 2; a new file sorts first, so every file's index moves: the old shards must not
    after = [_fake("s3://b/0", 6), _fake("s3://b/a", 7), _fake("s3://b/b", 3)]
    segments = recorded_segments([{"url": "s3://b/a", "rows": 5}, {"url": "s3://b/b", "rows": 3}], None)
    segments.append([("s3://b/0", 0, 6), ("s3://b/a", 5, 7)])
    plan = Shards(after, 4, segments)
    assert _by_url(plan)[:2] == _by_url(old)
    assert _by_url(plan)[2:] == [[("s3://b/0", 0, 4)], [("s3://b/0", 4, 6), ("s3://b/a", 5, 7)]]
    assert len(plan) == shard_count(segments, 4) == 4 and plan.rows == 16
    assert [plan.rows_of(i) for i in range(4)] == [4, 4, 4, 4]
    assert [plan[i].id for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        plan[4]


def test_each_segment_ends_in_its_own_short_shard():
    files = [_fake("a", 10)]
    plan = Shards(files, 4, [[("a", 0, 5)], [("a", 5, 6)], [("a", 6, 10)]])
    assert [plan.rows_of(i) for i in range(len(plan))] == [4, 1, 1, 4]
    assert _by_url(plan) == [[("a", 0, 4)], [("a", 4, 5)], [("a", 5, 6)], [("a", 6, 10)]]


def test_one_recorded_segment_is_the_plan_of_every_file_whole():
    files = [_fake("a", 3), _fake("b", 0), _fake("c", 9)]
    whole = Shards(files, 4)
    again = Shards(files, 4, recorded_segments([{"url": f.url, "rows": f.num_rows} for f in files], None))
    assert _by_url(whole) == _by_url(again) and len(whole) == 3


def test_a_recorded_plan_that_does_not_fit_the_inputs_is_one_line():
    with pytest.raises(ValueError, match="names gone"):
        Shards([_fake("a", 3)], 4, [[("gone", 0, 3)]])
    with pytest.raises(ValueError, match=r"rows \[0, 9\) of a"):
        Shards([_fake("a", 3)], 4, [[("a", 0, 9)]])


def _write(path, prompts: list[str], seeds: list[int] | None = None):
    cols = {"prompt_id": [f"id{i}" for i in range(len(prompts))], "prompt": prompts}
    if seeds is not None:
        cols["seed"] = seeds
    pq.write_table(pa.table(cols), str(path), row_group_size=700)


def _inputs(root) -> tuple[list[InputFile], list[dict]]:
    files = with_identities(list_inputs([str(root)]))
    return files, [{"url": f.url, "rows": f.num_rows, "bytes": f.size, "content": f.identity} for f in files]


def test_the_rows_added_are_found_and_changed_or_removed_ones_refused_naming_them(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    n = 2 * CHUNK + 100  # two whole digest chunks and a part one
    prompts = [f"p{i}" for i in range(n)]
    _write(root / "b.parquet", prompts)
    old_files, old_inputs = _inputs(root)
    digests = digests_for(old_files, old_inputs, [], None)
    assert len(digests[old_files[0].url]) == 3 * 16
    assert added_rows(old_inputs, old_inputs, digests, old_files) == []  # nothing grew: nothing to do

    _write(root / "b.parquet", prompts + ["new1", "new2"])  # appended
    _write(root / "a.parquet", ["first"])                   # a new file that sorts first
    files, inputs = _inputs(root)
    b = files[1].url
    assert added_rows(old_inputs, inputs, digests, files) == [(files[0].url, 0, 1), (b, n, n + 2)]

    for k, rows in ((5, f"rows 0-{CHUNK - 1} changed"), (2 * CHUNK + 7, f"rows {2 * CHUNK}-{n - 1} changed")):
        changed = prompts[:k] + ["edited"] + prompts[k + 1:]
        _write(root / "b.parquet", changed + ["new1"])
        files, inputs = _inputs(root)
        with pytest.raises(InputError) as e:
            added_rows(old_inputs, inputs, digests, files)
        assert f"{b}: {rows} since the last run" in str(e.value) and "\n" not in str(e.value)

    _write(root / "b.parquet", prompts[:10])
    files, inputs = _inputs(root)
    with pytest.raises(InputError, match=f"rows 10-{n - 1} removed"):
        added_rows(old_inputs, inputs, digests, files)
    (root / "b.parquet").unlink()
    files, inputs = _inputs(root)
    with pytest.raises(InputError, match=f"{b}: removed"):
        added_rows(old_inputs, inputs, digests, files)


def test_a_changed_seed_is_a_changed_row(tmp_path):
    _write(tmp_path / "p.parquet", ["a", "b", "c"], seeds=[1, 2, 3])
    old_files, old_inputs = _inputs(tmp_path / "p.parquet")
    digests = digests_for(old_files, old_inputs, [], None)
    _write(tmp_path / "p.parquet", ["a", "b", "c", "d"], seeds=[1, 2, 4, 5])
    files, inputs = _inputs(tmp_path / "p.parquet")
    with pytest.raises(InputError, match="rows 0-2 changed"):
        added_rows(old_inputs, inputs, digests, files)
    assert row_digests(files[0])[0] != digests[old_files[0].url]


def test_a_text_input_grows_as_a_parquet_one_does(tmp_path):
    """A JSONL file a nightly job appends to (inputs/text.py): its added rows found, an edited line refused; its
    digests are those of its Parquet twin (the same rows, whatever the format)."""
    p = tmp_path / "p.jsonl"
    p.write_text("".join(f'{{"prompt": "p{i}", "prompt_id": "id{i}"}}\n' for i in range(5)))
    old_files, old_inputs = _inputs(p)
    digests = digests_for(old_files, old_inputs, [], None)
    _write(tmp_path / "twin.parquet", [f"p{i}" for i in range(5)])
    assert row_digests(with_identities(list_inputs([str(tmp_path / "twin.parquet")]))[0])[0] == \
        digests[old_files[0].url]
    with open(p, "a") as fh:
        fh.write('{"prompt": "p5", "prompt_id": "id5"}\n')
    files, inputs = _inputs(p)
    assert added_rows(old_inputs, inputs, digests, files) == [(files[0].url, 5, 6)]
    p.write_text(p.read_text().replace('"p2"', '"edited"'))
    files, inputs = _inputs(p)
    with pytest.raises(InputError, match="rows 0-4 changed"):
        added_rows(old_inputs, inputs, digests, files)
