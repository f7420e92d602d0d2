"""Outputs that dataset builders can train on directly: the image encodings, the images Parquet that Hugging Face
`datasets` decodes to PIL images (and pandas, polars and duckdb read as is), and user errors found once the flow
has started ending in one `error:` line."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from pipeline_helpers import eval_rows, write_parquet

from ssdgen.output.marker import Marker

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "webp": b"RIFF", "jpeg": b"\xff\xd8\xff"}


def _pixels(seed=0, size=32):
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["png", "webp", "jpeg"])
def test_encoding_is_deterministic_per_format(fmt):
    from PIL import Image
    from ssdgen.formats.images import encode_image
    img = _pixels()
    a, b = encode_image(img, fmt, 80), encode_image(img, fmt, 80)
    assert a == b and a.startswith(MAGIC[fmt])  # a retried shard is byte-identical
    assert Image.open(io.BytesIO(a)).size == (32, 32)
    if fmt == "png":
        assert encode_image(img, fmt, 10) == a  # png is lossless: quality is ignored
    else:
        assert encode_image(img, fmt, 10) != a


def test_bad_format_or_quality_is_a_user_error():
    from ssdgen.formats.images import check_image_format
    with pytest.raises(ValueError, match="--image-format"):
        check_image_format("gif", 90)
    with pytest.raises(ValueError, match="--quality"):
        check_image_format("webp", 0)


def _shard(tmp_path, fmt="webp"):
    """One committed-style images.parquet written by the layout code: two ok images and one error row."""
    from ssdgen.output.layout import Output, shard_tables
    from ssdgen.formats.images import encode_image
    from ssdgen.workers.results import Sample
    rows = [{"prompt_id": f"p{i}", "prompt": f"prompt {i}", "seed": i} for i in range(3)]
    samples = {f"p{i}": Sample(f"p{i}", "ok", image=encode_image(_pixels(i, 16 + 8 * i), fmt, 90),
                               width=16 + 8 * i, height=16 + 8 * i, grid=(2, 2), tokens=[1, 2, 3, 4], latency_s=0.1)
               for i in range(2)}
    samples["p2"] = Sample.failed("p2", "bad", "grammar")
    images, _ = shard_tables(samples, rows, "ar", "tiny", fmt)
    out = Output(str(tmp_path / "run"))
    rec = out.store.write_table(out.path("shards", "000000", "attempt-x", "images.parquet"), images)
    return out.path(rec["path"])


def test_hf_datasets_reads_the_images_as_pil_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image
    path = _shard(tmp_path)
    ds = datasets.load_dataset("parquet", data_files=path, cache_dir=str(tmp_path / "hf"))["train"]
    assert isinstance(ds.features["image"], datasets.Image)
    first = ds[0]
    assert isinstance(first["image"], Image.Image) and first["image"].size == (16, 16)
    assert first["image_format"] == "webp" and first["tokens"] == [1, 2, 3, 4] and first["prompt_id"] == "p0"
    assert ds[1]["image"].size == (24, 24) and ds[2]["image"] is None  # a failed sample has no image


def test_plain_readers_need_no_project_code(tmp_path):
    import duckdb
    import pandas as pd
    import polars as pl
    from PIL import Image
    path = _shard(tmp_path)
    df = pd.read_parquet(path)
    assert Image.open(io.BytesIO(df["image"][0]["bytes"])).size == (16, 16)
    assert pl.read_parquet(path)["image"].struct.field("bytes")[1][:4] == b"RIFF"
    [(n,)] = duckdb.sql(f"select count(*) from '{path}' where image is not null and image_format = 'webp'").fetchall()
    assert n == 2


def test_image_format_and_quality_are_recorded_settings():
    from ssdgen.inputs.files import InputFile
    from ssdgen.flows.pipeline import RunSettings
    files = [InputFile("file:///x.parquet", 3, (3,), 100, True, False)]
    png = RunSettings(prompts=("x",)).recorded(files)
    assert (png["image_format"], png["quality"]) == ("png", None)  # png ignores the quality: null, not 90
    assert RunSettings(prompts=("x",), quality=50).recorded(files) == png  # so another one resumes
    webp = RunSettings(prompts=("x",), image_format="webp", quality=80).recorded(files)
    assert webp == png | {"image_format": "webp", "quality": 80}


def _cli(*args, home):
    # a private Prefect home: the temporary API server's database is not shared with other processes
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([sys.executable, "-m", "ssdgen.cli", "generate", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=600, env=env)


def _assert_one_error_line(r, *needles):
    text = r.stdout + r.stderr
    assert r.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], text[-3000:]
    assert all(n in errors[0] for n in needles), errors[0]


@pytest.mark.slow
@pytest.mark.integration  # a CLI subprocess that starts Prefect's temporary server
def test_cli_duplicate_ids_across_files_one_error_line(tmp_path):
    rows = eval_rows(3)
    write_parquet(None, tmp_path / "a.parquet", rows[:2])
    write_parquet(None, tmp_path / "b.parquet", rows[1:])
    out = tmp_path / "run"
    r = _cli("--prompts", str(tmp_path / "a.parquet"), "--prompts", str(tmp_path / "b.parquet"), "--out", str(out),
             home=tmp_path / "prefect")
    _assert_one_error_line(r, "duplicate prompt_id", "a.parquet row 1", "b.parquet row 0")
    assert not out.exists()  # nothing committed, not even the config


@pytest.mark.slow
@pytest.mark.integration
def test_cli_output_with_other_settings_one_error_line(tmp_path):
    from ssdgen.inputs.files import list_inputs, with_identities
    from ssdgen.output.layout import Output
    from ssdgen.flows.pipeline import RunSettings
    src = tmp_path / "p.parquet"
    write_parquet(None, src, eval_rows(2))
    out = tmp_path / "run"
    from ssdgen.decoders.spec import DecodeSpec
    old = RunSettings(prompts=(str(src),), image_format="webp", decoder=DecodeSpec.parse("ssd+csd")).recorded(
        with_identities(list_inputs([str(src)])))  # the CLI's default decoder, so only the image format differs
    Output(str(out)).write_config(old, replacing=False)  # an earlier run's settings: webp
    # a committed (empty) shard: settings are pinned only once one is (a run that committed nothing may change)
    Output(str(out)).commit(Marker.from_dict({"shard": 0, "files": [], "rows": 0, "ok": 0, "failed": 0}))
    r = _cli("--prompts", str(src), "--out", str(out), "--shard-size", "256", home=tmp_path / "prefect")
    _assert_one_error_line(r, "other settings", "(image_format, quality differ", "image_format was 'webp', now 'png'")
    assert sorted(p.name for p in out.iterdir()) == ["_config.json", "shards"]  # nothing more written
    assert json.loads((out / "_config.json").read_text()) == old  # and the old run's settings untouched
