"""`--incremental` in real runs (a local Ray, Prefect's test server, the tiny model; #36 item 4): rows appended to
an input and a new file that sorts first become new shards, every prompt is committed exactly once, the first
run's shards stay byte for byte; a changed row is one `error:` line naming the file and the rows, rc 2, nothing
written; without --incremental the grown input is still refused. Fast tests: test_incremental.py."""

import json

import pytest
from pipeline_helpers import committed_tables, eval_rows, run_flow, write_parquet
from test_operations import one_error, ssdgen

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server", "local_ray")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ssdgen.reference.tiny import tiny_model
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model(path)  # 4x4 tokens: a shard decodes in a blink
    return f"reference:{path}"


def _files(root) -> dict[str, tuple[bytes, int]]:
    """Every file under root: its bytes and mtime."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_an_incremental_run_over_appended_inputs_commits_every_prompt_exactly_once(tmp_path, tiny):
    from ssdgen.output.layout import ConfigMismatch
    from ssdgen.output.reader import run_status
    rows = eval_rows(19)
    src, out = tmp_path / "in", tmp_path / "run"
    src.mkdir()
    write_parquet(None, src / "b.parquet", rows[:10])
    args = dict(prompts=[str(src)], out=str(out), model=tiny, shard_size=4, batch_size=4, actors=1)
    assert run_flow(**args)["shards_committed"] == 3  # 4 + 4 + 2
    first = _files(out / "shards")

    write_parquet(None, src / "b.parquet", rows[:13])             # 3 rows appended
    write_parquet(None, src / "a.parquet", rows[13:])             # a new file, sorting before b: 6 rows
    with pytest.raises(ConfigMismatch, match="--incremental"):  # a plain run still refuses, in one line
        run_flow(**args)
    dry = ssdgen("generate", "--prompts", str(src), "--out", str(out), "--model", tiny, "--decoder", "ar",
                 "--shard-size", "4", "--batch-size", "4", "--actors", "1", "--incremental", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "--incremental: 9 rows added since the last run, as new shards 3-5" in dry.stdout, dry.stdout
    assert "19 prompts in 6 shards: 3 committed, 3 pending (9 prompts)" in dry.stdout, dry.stdout
    assert not (out / "shards" / "000003").exists()  # a dry run writes nothing

    s = run_flow(**args, incremental=True)
    assert (s["shards_total"], s["shards_committed"], s["shards_run_now"]) == (6, 6, 3)
    images, _ = committed_tables(str(out))
    ids = images.column("prompt_id").to_pylist()
    assert sorted(ids) == sorted(r["prompt_id"] for r in rows) and len(ids) == len(set(ids)) == 19
    assert {k: v for k, v in _files(out / "shards").items() if k in first} == first  # the old shards untouched
    st = run_status(str(out))
    assert (st["shards_total"], st["shards_done"], st["shards_pending"]) == (6, 6, 0)
    again = run_flow(**args)  # the grown plan is the run's now: a plain resume finds nothing to do
    assert again["shards_run_now"] == 0 and again["shards_total"] == 6

    before = _files(out)
    edited = rows[:13]
    edited[11] = dict(edited[11], prompt="a small blue square at the top left on a flat white background")
    write_parquet(None, src / "b.parquet", edited + eval_rows(2, start=40))
    proc = ssdgen("generate", "--prompts", str(src), "--out", str(out), "--model", tiny, "--decoder", "ar",
                  "--shard-size", "4", "--batch-size", "4", "--actors", "1", "--incremental")
    line = one_error(proc, f"{(src / 'b.parquet').as_uri()}: rows 0-12 changed since the last run")
    assert json.loads((out / "_config.json").read_text())["inputs"][1]["rows"] == 13, line
    assert _files(out) == before  # nothing written
