"""Exports a user loads with `datasets.load_dataset(folder)` (#36 item 2): `ssdgen export --format hf` is one table
(the image, the prompt, the kept input columns, the statistics) with a dataset card; the Parquet export loads its
images (its statistics as the card's `stats` config) and the WebDataset export loads with its images."""

import json

import pytest
import yaml
from test_input_columns import EXTRA, _rows, _write
from test_operations import ssdgen

from pipeline_helpers import run_flow


def _card(folder) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    _, head, body = text.split("---\n", 2)
    return yaml.safe_load(head), body


def _check_hf(folder, tmp_path, want):
    import datasets
    import polars as pl
    ds = datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert len(ds) == len(want) and ds[0]["image"].size == (64, 64)
    assert {r["prompt_id"]: (r["prompt"], r["license"], r["taken"]) for r in ds} == want
    assert all(r["forwards"] == 256 and r["status"] == "ok" for r in ds)  # the statistics, in the same table
    df = pl.read_parquet(str(folder / "data" / "*.parquet"))
    assert sorted(df["license"].to_list()) == sorted(w[1] for w in want.values()) and "forwards" in df.columns
    head, body = _card(folder)
    assert head["configs"] == [{"config_name": "default", "data_files": [{"split": "train",
                                                                          "path": "data/*.parquet"}]}]
    features = {f["name"]: f for f in head["dataset_info"]["features"]}
    assert features["image"] == {"name": "image", "dtype": "image"} and features["license"]["dtype"] == "string"
    assert features["tokens"] == {"name": "tokens", "sequence": {"dtype": "int32"}}
    (split,) = head["dataset_info"]["splits"]  # with num_bytes: `datasets` reads it (tests/test_export_card.py)
    assert split["name"] == "train" and split["num_examples"] == len(want) and split["num_bytes"] > 0
    assert head["license"] == "other" and "`cc-by-0` (1 input row)" in body  # a license per row: listed
    assert "6 prompts, 6 images, 0 failed" in body and "`ar:cfg=3.0" in body and "(6 rows)" in body
    assert "reference" in body and "Not measured in this run" in body


def _check_parquet_and_webdataset(pq_folder, wds_folder, tmp_path, want):
    import datasets
    import webdataset as wds
    ds = datasets.load_dataset(str(pq_folder), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert {r["prompt_id"]: (r["prompt"], r["license"], r["taken"]) for r in ds} == want and ds[0]["image"]
    stats = datasets.load_dataset(str(pq_folder), "stats", split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert len(stats) == 6 and "forwards" in stats.column_names
    got = datasets.load_dataset(str(wds_folder), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert len(got) == 6 and got[0]["png"].size == (64, 64)  # the images, not the statistics sidecars
    assert {r["json"]["prompt_id"]: r["json"]["license"] for r in got} == {k: v[1] for k, v in want.items()}
    tars = sorted(str(p) for p in wds_folder.glob("*.tar"))
    metas = [x["json"] for x in wds.WebDataset(tars, shardshuffle=False).decode()]
    assert {m["prompt_id"]: m["taken"] for m in metas} == {k: v[2].isoformat() for k, v in want.items()}


@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_exports_load_with_datasets_polars_and_webdataset_with_their_images_and_kept_columns(tmp_path):
    _write(tmp_path / "p.parquet", _rows(6))
    out = tmp_path / "run"
    s = run_flow(prompts=[str(tmp_path / "p.parquet")], out=str(out), format="both", shard_size=4, batch_size=4,
                 actors=1)
    assert s["images_ok"] == 6
    want = {r["prompt_id"]: (r["prompt"], r["license"], r["taken"]) for r in _rows(6)}
    for fmt in ("hf", "parquet", "webdataset"):
        proc = ssdgen("export", str(out), "--to", str(tmp_path / fmt), "--format", fmt)
        assert proc.returncode == 0 and "exported 2 committed shards" in proc.stdout, proc.stderr[-2000:]
    _check_hf(tmp_path / "hf", tmp_path, want)
    _check_parquet_and_webdataset(tmp_path / "parquet", tmp_path / "webdataset", tmp_path, want)
    assert json.loads((out / "_config.json").read_text())["columns"] == EXTRA.names


def test_hf_is_an_export_format_only():
    from ssdgen.flows.settings import RunSettings
    with pytest.raises(ValueError, match="--format must be one of parquet, webdataset, both"):
        RunSettings(prompts=("x",), format="hf").check()
