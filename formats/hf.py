"""The Hugging Face format, for `ssdgen export --format hf` (a run does not write it): a folder that
`datasets.load_dataset(folder)` loads as one table, ready to push to the Hub:

    data/train-{shard:05d}.parquet   a row per ok prompt: the image (the `Image` feature), the prompt, its id and
                                     seed, the model and the resolved decoder, the tokens, the input columns the
                                     run kept, and the sample's statistics
    README.md                        the dataset card (output.card): configs, features, counts, provenance

Failed prompts have no image: they are left out and counted in the card. The features `datasets` decodes by are
in each file's schema metadata (`hf_metadata`, key b"huggingface"), the same the run's images.parquet carries,
and in the card.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from ssdgen.storage.store import parquet_bytes

from .registry import Format, register

# `image` is the struct Hugging Face `datasets` stores its Image feature as ({bytes, path}); with the features
# in the schema metadata, `datasets.load_dataset("parquet", ...)` decodes it to a PIL image, while pandas,
# polars, duckdb and Ray Data read it as a plain struct.
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
# Arrow's names that `datasets` spells otherwise (its Value dtypes); every other type is spelled alike
_DTYPES = {"halffloat": "float16", "float": "float32", "double": "float64", "date32[day]": "date32",
           "date64[ms]": "date64"}


def feature(t: pa.DataType):
    """A column's `datasets` feature as JSON. Lists use the `Sequence` spelling, which every `datasets` release
    reads (newer ones translate it to `List`); a struct is a dict of its fields' features; a dictionary-encoded
    column is its values' type, as `datasets` reads it."""
    if t == IMAGE_TYPE:
        return {"_type": "Image"}
    if pa.types.is_dictionary(t):
        return feature(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"feature": feature(t.value_type), "_type": "Sequence"}
    if pa.types.is_struct(t):
        return {f.name: feature(f.type) for f in t}
    return {"dtype": _DTYPES.get(str(t), str(t)), "_type": "Value"}


def hf_metadata(fields: list[tuple[str, pa.DataType]]) -> dict[bytes, bytes]:
    """The schema metadata `datasets` reads its features from (key b"huggingface")."""
    features = {name: feature(t) for name, t in fields}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def joined(images: pa.Table, stats: pa.Table) -> pa.Table:
    """A shard's ok rows as one table: the images' columns, then each statistic the images do not hold, paired
    by prompt_id; with the features in its metadata."""
    ok = images.filter(pc.invert(pc.is_null(images.column("image"))))
    at = pc.index_in(ok.column("prompt_id"), value_set=stats.column("prompt_id"))
    extra = [n for n in stats.column_names if n not in ok.column_names]
    cols = ok.columns + [stats.column(n).take(at) for n in extra]
    fields = [(f.name, f.type) for f in ok.schema] + [(n, stats.schema.field(n).type) for n in extra]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=hf_metadata(fields)))


def _encode(shard: int, images: pa.Table, stats: pa.Table, shard_size: int) -> tuple[bytes, int]:
    table = joined(images, stats)
    return parquet_bytes(table), table.num_rows


HF = register(Format(
    name="hf", kind="hf", file_name=lambda shard: f"train-{shard:05d}.parquet", encode=_encode,
    export_name=lambda shard: f"data/train-{shard:05d}.parquet", stats_export_name=None, run=False,
    card_files="data/*.parquet"))
