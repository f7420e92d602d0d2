"""WebDataset output (img2dataset's layout) and reading a run's committed output: tars under the attempt key that
only the commit marker makes visible, `ssdgen.open_run`, `ssdgen export`, and a run on moto's S3 server read back
with the `webdataset` package, Ray Data and Hugging Face `datasets`, without project code."""

import io
import json
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import eval_rows, run_flow, write_parquet

from ssdgen.output.marker import Marker


def _tables(shard, n=3, fmt="webp", failed=(2,)):
    """A shard's images and stats tables as the flow builds them: n prompts, the ones in `failed` error rows."""
    from ssdgen.output.layout import shard_tables
    from ssdgen.formats.images import encode_image
    rows = [{"prompt_id": f"s{shard}-p{i}", "prompt": f"prompt {shard}.{i}", "seed": i} for i in range(n)]
    pixels = np.random.default_rng(shard).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    stats = {"forwards": 7, "acceptance_rate": 0.5, "tokens_per_forward": 2.0, "tokens_per_forward_hist": [1, 2],
             "commit_map": [0, 1], "mean_entropy": 1.5, "relaxed": 0}
    from ssdgen.workers.results import Sample
    samples = {r["prompt_id"]: Sample.failed(r["prompt_id"], "bad", "grammar") if i in failed else
               Sample(r["prompt_id"], "ok", image=encode_image(pixels, fmt, 90), width=16, height=16, grid=(2, 2),
                      tokens=[1, 2, 3, 4], stats=stats | {"forwards": 7 + i}, latency_s=0.1)
               for i, r in enumerate(rows)}
    return shard_tables(samples, rows, "ar", "tiny", fmt)


def _members(data):
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_shard_tar_follows_img2dataset_conventions():
    from ssdgen.formats.webdataset import index_digits, shard_tar
    images, stats = _tables(3, fmt="jpeg")
    data, n = shard_tar(3, images, stats)
    files = _members(data)
    assert n == 2 and sorted(files) == ["000030000.jpg", "000030000.json", "000030000.txt",
                                        "000030001.jpg", "000030001.json", "000030001.txt"]  # no failed sample
    meta = json.loads(files["000030001.json"])
    assert files["000030001.txt"] == b"prompt 3.1" and files["000030001.jpg"][:3] == b"\xff\xd8\xff"
    assert meta["prompt_id"] == "s3-p1" and meta["key"] == "000030001" and meta["forwards"] == 8
    assert meta["seed"] == 1 and meta["decoder"] == "ar" and meta["model"] == "tiny" and meta["status"] == "ok"
    assert shard_tar(3, images, stats)[0] == data  # fixed headers: a retried shard writes the same bytes
    assert index_digits(256) == 4 and index_digits(20_000) == 5


def _commit(out, shard, fmt="both", attempt=None):
    from ssdgen.formats import write_shard
    images, stats = _tables(shard)
    attempt = attempt or out.new_attempt(shard)
    files = write_shard(out, attempt, shard, images, stats, fmt, shard_size=4)
    assert out.commit(Marker.from_dict({"shard": shard, "attempt": attempt.rsplit("/", 1)[-1], "files": files,
                                        "rows": 3, "ok": 2, "failed": 1}))
    return attempt


def _run_dir(tmp_path):
    """A run where shard 0 committed, a retry of shard 0 died mid-write (half a tar, no marker) and shard 1 was
    written but never committed (the driver died before its marker)."""
    from ssdgen.output.layout import Output
    out = Output(str(tmp_path / "run"))
    out.write_config({"shard_size": 4}, replacing=False)
    committed = _commit(out, 0)
    losing = out.new_attempt(0)
    out.store.write_bytes(f"{losing}/00000.tar", b"half a tar", 1)
    from ssdgen.formats import write_shard
    write_shard(out, out.new_attempt(1), 1, *_tables(1), "both", 4)
    return out, committed


def test_an_uncommitted_or_interrupted_tar_is_never_read(tmp_path):
    import webdataset as wds
    import ssdgen
    out, committed = _run_dir(tmp_path)
    assert len(out.store.fs.glob(out.path("shards", "*", "attempt-*", "*.tar"))) == 3  # all written, one committed
    got = ssdgen.open_run(out.url).to_table()  # no manifest yet: from the markers
    assert got.column("prompt_id").to_pylist() == ["s0-p0", "s0-p1", "s0-p2"]
    assert got.column("forwards").to_pylist() == [7, 8, None] and got.column("status").to_pylist()[2] == "error"
    out.write_manifest(out.committed())
    man = pq.read_table(out.path("manifest.parquet")).to_pylist()
    assert [m["shard"] for m in man] == [0] and man[0]["tar_url"] == out.full_url(f"{committed}/00000.tar")
    assert ssdgen.open_run(out.url, columns=["acceptance_rate"]).to_table().column_names == \
        ["prompt_id", "acceptance_rate"]
    r = ssdgen.export(out.url, str(tmp_path / "wds"), "webdataset")
    assert r["shards"] == 1 and sorted(p.name for p in (tmp_path / "wds").iterdir()) == [
        "00000.parquet", "00000.tar", "README.md"]
    keys = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "wds" / "00000.tar"), shardshuffle=False)]
    assert keys == ["000000000", "000000001"]
    ssdgen.export(out.url, str(tmp_path / "pq"), "parquet")
    assert sorted(str(p.relative_to(tmp_path / "pq")) for p in (tmp_path / "pq").rglob("*.parquet")) == \
        ["images/00000.parquet", "stats/00000.parquet"]
    (tmp_path / "run" / committed.rsplit("run/", 1)[1] / "00000.tar").write_bytes(b"changed")
    with pytest.raises(OSError, match="SHA-256"):
        ssdgen.export(out.url, str(tmp_path / "wds2"), "webdataset")


def test_webdataset_alone_and_export_of_a_parquet_run(tmp_path):
    import ssdgen
    from ssdgen.output.layout import Output
    from ssdgen.formats.webdataset import shard_tar
    wds_only = Output(str(tmp_path / "w"))
    wds_only.write_config({"shard_size": 4}, replacing=False)
    a = _commit(wds_only, 0, fmt="webdataset")
    assert sorted(p.name for p in (tmp_path / "w" / a.rsplit("w/", 1)[1]).iterdir()) == ["00000.tar", "stats.parquet"]
    assert "image" not in ssdgen.open_run(wds_only.url).schema.names  # the statistics; images are in the tar
    with pytest.raises(ValueError, match="--format webdataset"):
        ssdgen.export(wds_only.url, str(tmp_path / "x"), "parquet")
    pq_only = Output(str(tmp_path / "p"))
    pq_only.write_config({"shard_size": 4}, replacing=False)
    _commit(pq_only, 0, fmt="parquet")
    ssdgen.export(pq_only.url, str(tmp_path / "built"), "webdataset")  # tars built from the Parquet
    assert (tmp_path / "built" / "00000.tar").read_bytes() == shard_tar(0, *_tables(0))[0]


def test_report_reads_the_images_of_a_webdataset_only_run(tmp_path):
    from ssdgen.bench.report import load_run
    from ssdgen.output.layout import Output
    out = Output(str(tmp_path / "w"))
    out.write_config({"shard_size": 4}, replacing=False)
    _commit(out, 0, fmt="webdataset")
    run = load_run(out.url)
    ok = [im for im in run["images"] if im["image"] is not None]
    images, _ = _tables(0)
    want = {r["prompt_id"]: r["image"]["bytes"] for r in images.to_pylist() if r["image"]}
    assert {im["prompt_id"]: im["image"] for im in ok} == want and len(want) == 2  # from the tar, byte for byte


def test_format_is_validated_and_recorded():
    from ssdgen.inputs.files import InputFile
    from ssdgen.flows.pipeline import RunSettings
    with pytest.raises(ValueError, match="--format must be one of parquet, webdataset, both"):
        RunSettings(prompts=("x",), format="zip").check()
    files = [InputFile("file:///x.parquet", 3, (3,), 100, True, False)]
    base = RunSettings(prompts=("x",)).recorded(files)
    assert base["format"] == "parquet"  # recorded at its default too
    assert RunSettings(prompts=("x",), format="both").recorded(files) == base | {"format": "both"}


@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_s3_run_in_both_formats_reads_without_project_code(s3, s3_endpoint, tmp_path, monkeypatch):
    import datasets
    import pyarrow.fs
    import ray
    import webdataset as wds
    import ssdgen
    rows = eval_rows(10)
    write_parquet(s3, "ssdgen-test/in/p.parquet", rows)
    s = run_flow(prompts=["s3://ssdgen-test/in/"], out="s3://ssdgen-test/wds", format="both", image_format="webp",
                 shard_size=4, batch_size=4, actors=1)
    assert s["shards_committed"] == 3 and s["images_ok"] == 10 and s["format"] == "both"
    captions = {r["prompt_id"]: r["prompt"] for r in rows}
    man = pq.read_table(s3.open("ssdgen-test/wds/manifest.parquet")).to_pylist()
    stats = {r["prompt_id"]: r for m in man for r in pq.read_table(s3.open(m["stats_url"])).to_pylist()}
    tars = [m["tar_url"] for m in man]
    assert [t.rsplit("/", 1)[1] for t in tars] == ["00000.tar", "00001.tar", "00002.tar"]

    def check(pairs):  # (prompt_id, caption, forwards) per sample: each prompt exactly once
        assert sorted(p for p, _, _ in pairs) == sorted(captions)
        assert all(c == captions[p] and f == stats[p]["forwards"] > 0 for p, c, f in pairs)

    # webdataset, streaming the tars over HTTPS-style presigned URLs (curl), as from a private bucket
    samples = list(wds.WebDataset([s3.url(t, expires=600) for t in tars], shardshuffle=False).decode("pil"))
    check([(x["json"]["prompt_id"], x["txt"], x["json"]["forwards"]) for x in samples])
    assert all(x["json"]["acceptance_rate"] is None for x in samples)  # ar's NaN, as strict JSON's null
    assert all(x["webp"].size == (x["json"]["width"], x["json"]["height"]) for x in samples)
    # Ray Data, with Arrow's own S3 client
    fs = pyarrow.fs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", access_key="testing-key-id",
                                 secret_key="testing-secret", region="us-east-1")
    got = ray.data.read_webdataset([t.removeprefix("s3://") for t in tars], filesystem=fs).take_all()
    check([(r["json"]["prompt_id"], r["txt"], r["json"]["forwards"]) for r in got])
    assert all(r["webp"][:4] == b"RIFF" for r in got)  # Ray decodes json and txt; webp stays bytes
    # Hugging Face datasets: the images Parquet, its image column decoded to PIL images
    # The Makefile sets HF_HUB_OFFLINE (no hub here), which `datasets` also applies to every remote URL, moto's
    # S3 on 127.0.0.1 included; a user reading from their bucket has it unset.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    opts = {"endpoint_url": s3_endpoint, "key": "testing-key-id", "secret": "testing-secret"}
    hf = datasets.load_dataset("parquet", data_files=[m["images_url"] for m in man], storage_options=opts,
                               cache_dir=str(tmp_path / "hf"))["train"]
    check([(r["prompt_id"], r["prompt"], stats[r["prompt_id"]]["forwards"]) for r in hf])
    assert hf[0]["image"].format == "WEBP"
    # and the project's own reader
    t = ssdgen.open_run("s3://ssdgen-test/wds").to_table().to_pylist()
    check([(r["prompt_id"], r["prompt"], r["forwards"]) for r in t])
