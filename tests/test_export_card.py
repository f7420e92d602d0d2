"""The dataset card of an export (output/card.py), on a run committed by hand (no flow): `datasets.load_dataset`
reads its split without a warning, it publishes no local path or credential, and its `license:` follows the rows'
license column (#49: "splits field ... malformed" on every load, the input's absolute path, no license)."""

import logging

import numpy as np
import pyarrow as pa
import pytest
import yaml

import ssdgen
from ssdgen.formats import write_shard
from ssdgen.formats.images import encode_image
from ssdgen.output.card import public
from ssdgen.output.layout import Output, shard_tables
from ssdgen.output.marker import Marker
from ssdgen.workers.results import Sample

SECRET_INPUT = "/home/someone/private/prompts.parquet"
SIGNED_INPUT = "https://user:hunter2@example.com/data/more.csv?X-Amz-Signature=abc#frag"


def _commit(out: Output, shard: int, licenses: list) -> None:
    """A shard of len(licenses) prompts, the last one failed, its kept input column `license`."""
    rows = [{"prompt_id": f"s{shard}-p{i}", "prompt": f"prompt {shard}.{i}", "seed": i} for i in range(len(licenses))]
    pixels = np.random.default_rng(shard).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    samples = {r["prompt_id"]: Sample.failed(r["prompt_id"], "bad", "grammar") if i == len(rows) - 1 else
               Sample(r["prompt_id"], "ok", image=encode_image(pixels, "png", 90), width=16, height=16, grid=(2, 2),
                      tokens=[1, 2, 3, 4], stats={"forwards": 7}, latency_s=0.1)
               for i, r in enumerate(rows)}
    images, stats = shard_tables(samples, rows, "ar", "tiny", "png", kept=pa.table({"license": pa.array(
        licenses, pa.string())}))
    attempt = out.new_attempt(shard)
    files = write_shard(out, attempt, shard, images, stats, "parquet", shard_size=4)
    assert out.commit(Marker.from_dict({"shard": shard, "attempt": attempt.rsplit("/", 1)[-1], "files": files,
                                        "rows": len(rows), "ok": len(rows) - 1, "failed": 1}))


def _run(tmp_path, licenses: list) -> Output:
    out = Output(str(tmp_path / "run"))
    out.write_config({"shard_size": 4, "columns": ["license"], "model": "reference:/home/someone/models/scenes",
                      "decoder": "ssd:heads=/home/someone/heads.safetensors", "seed": 0,
                      "inputs": [{"url": SECRET_INPUT, "rows": 4}, {"url": SIGNED_INPUT, "rows": 4}]},
                     replacing=False)
    _commit(out, 0, licenses[:4])
    _commit(out, 1, licenses[4:])
    out.write_manifest(out.committed())
    return out


def _card(folder) -> tuple[dict, str]:
    _, head, body = (folder / "README.md").read_text().split("---\n", 2)
    return yaml.safe_load(head), body


def test_load_dataset_reads_the_cards_split_without_a_warning(tmp_path, caplog):
    import datasets
    out = _run(tmp_path, ["cc-by-4.0"] * 8)
    ssdgen.export(out.url, str(tmp_path / "hf"), "hf")
    head, _ = _card(tmp_path / "hf")
    split = head["dataset_info"]["splits"][0]
    assert split["name"] == "train" and split["num_examples"] == 6 and split["num_bytes"] > 0
    assert head["dataset_info"]["download_size"] == sum(
        p.stat().st_size for p in (tmp_path / "hf" / "data").glob("*.parquet"))
    with caplog.at_level(logging.WARNING):
        logging.getLogger("datasets").propagate = True  # datasets keeps its records to itself by default
        try:
            ds = datasets.load_dataset(str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "cache"))
        finally:
            logging.getLogger("datasets").propagate = False
    assert len(ds) == 6 and ds.info.splits["train"].num_examples == 6  # the card's split, read and checked
    assert ds.data.nbytes == pytest.approx(split["num_bytes"], rel=0.05)  # near the size `datasets` counts
    assert not [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()
                or "Ignoring part of dataset_info" in r.getMessage()]


@pytest.mark.parametrize("licenses, want, listed", [
    (["cc-by-4.0"] * 8, "cc-by-4.0", "`cc-by-4.0` (8 input rows)"),
    (["CC-BY-4.0 "] * 8, "cc-by-4.0", "`CC-BY-4.0` (8 input rows)"),
    (["mit"] * 3 + ["cc0-1.0"] * 5, "other", "`cc0-1.0` (5 input rows), `mit` (3 input rows)"),
    (["Creative Commons, see website"] * 8, "other", "`Creative Commons, see website` (8 input rows)"),
    ([None] * 8, None, None),
])
def test_the_cards_license_follows_the_rows_license_column(tmp_path, licenses, want, listed):
    out = _run(tmp_path, licenses)
    for fmt in ("hf", "parquet"):
        ssdgen.export(out.url, str(tmp_path / fmt), fmt)
        head, body = _card(tmp_path / fmt)
        assert head.get("license") == want, (fmt, head)
        assert (listed in body) if listed else "License" not in body, body


def test_the_card_publishes_no_local_path_and_no_credential(tmp_path):
    out = _run(tmp_path, ["mit"] * 8)
    ssdgen.export(out.url, str(tmp_path / "hf"), "hf")
    text = (tmp_path / "hf" / "README.md").read_text()
    assert "/home/someone" not in text and str(tmp_path) not in text
    assert "hunter2" not in text and "user:" not in text and "Signature" not in text and "#frag" not in text
    assert "`prompts.parquet` (4 rows)" in text and "`https://example.com/data/more.csv` (4 rows)" in text
    assert "`reference:scenes`" in text and "`ssd:heads=heads.safetensors`" in text
    assert "# Images generated by ssdgen from `run`" in text


@pytest.mark.parametrize("url, shown", [
    ("/data/in/p.parquet", "p.parquet"), ("file:///data/in/", "in"), ("relative/p.csv", "p.csv"),
    ("s3://bucket/prefix/p.parquet", "s3://bucket/prefix/p.parquet"),
    ("s3://KEY:SECRET@bucket/p.parquet", "s3://bucket/p.parquet"),
    ("https://h.example/p.jsonl?token=x", "https://h.example/p.jsonl"),
    ("simplecache::s3://b/p.parquet", "simplecache::s3://b/p.parquet"),
])
def test_public_names_a_path_by_name_and_a_url_without_credentials(url, shown):
    assert public(url) == shown
