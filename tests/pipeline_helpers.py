"""Helpers shared by the pipeline tests: prompt Parquet in, the committed output read back the way a user
would, and a generate run with small test defaults."""

import io

import pyarrow as pa
import pyarrow.parquet as pq

from ssdgen.reference.prompts import eval_prompts

SCHEMA = pa.schema([("prompt_id", pa.string()), ("prompt", pa.string())])


def write_parquet(fs, path, rows, schema=SCHEMA):
    """rows -> one Parquet file at path: on fsspec filesystem fs, or on the local disk when fs is None."""
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    if fs is None:
        with open(path, "wb") as f:
            f.write(buf.getvalue())
    else:
        fs.pipe_file(path, buf.getvalue())


def eval_rows(n, start=0):
    """n eval prompts (valid captions) as {prompt_id, prompt} rows."""
    return [{"prompt_id": r["prompt_id"], "prompt": r["prompt"]} for r in eval_prompts(start + n)[start:]]


def committed_tables(out_url):
    """Read the committed output the way a user would: the manifest, then plain pyarrow."""
    import fsspec
    fs, root = fsspec.core.url_to_fs(out_url)
    man = pq.read_table(fs.open(f"{root}/manifest.parquet", "rb")).to_pylist()
    images = [pq.read_table(fs.open(m["images_url"], "rb")) for m in man]
    stats = [pq.read_table(fs.open(m["stats_url"], "rb")) for m in man]
    return pa.concat_tables(images), pa.concat_tables(stats)


def run_flow(progress: bool = False, overwrite: bool = False, **kw):
    """The generate flow with small test settings (ar, 2 actors, no progress bar); kw override them."""
    from ssdgen.flows.pipeline import RunSettings, generate
    base = dict(decoder="ar", batch_size=16, shard_size=32, actors=2)
    return generate(RunSettings(**(base | kw)), progress=progress, overwrite=overwrite)
