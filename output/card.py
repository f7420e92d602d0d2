"""The dataset card of an export folder (`ssdgen export`): README.md, as the Hugging Face Hub reads it, so that
`datasets.load_dataset(folder)` loads the right files and a push publishes a dataset that says what made it.

The YAML header holds the configs (the format's data files as the default config, its statistics as a
`stats` config where they are separate files: formats/ `card_files`, `card_stats`), the license where the rows
carry one (a `license` input column: its one value, or `other` with the values in the text), and, where the
export is one table (hf), its features and its split's rows and bytes, spelled as `datasets` reads them (a
split without `num_bytes` made every `load_dataset` warn "The `splits` field in YAML is malformed"). The text
says what a user of the dataset needs: how many prompts, how many images, which were left out and why, the model
and the resolved decoder that made each row, the run's settings, its fidelity figures where the run measured them
(`generate --audit`), and how to load it.

A card is published with the dataset, so it names the run's inputs and folders as a reader elsewhere can take
them: a local path by its file name only, a remote URL without credentials, query or fragment (`public`).
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections import Counter

import fsspec
import yaml

from ssdgen.formats.hf import feature

from .audit import warning

CARD = "README.md"


def _yaml_feature(name: str, f) -> dict:
    """A `datasets` feature (formats.hf.feature's JSON) in the card's YAML spelling."""
    if "_type" not in f:  # a struct: a dict of its fields' features
        return {"name": name, "struct": [_yaml_feature(k, v) for k, v in f.items()]}
    if f["_type"] == "Image":
        return {"name": name, "dtype": "image"}
    if f["_type"] == "Sequence":
        inner = _yaml_feature(name, f["feature"])
        return {"name": name, "sequence": {k: v for k, v in inner.items() if k != "name"}}
    return {"name": name, "dtype": f["dtype"]}


def header(fmt, schema=None, rows: int | None = None, sizes: tuple[int, int] | None = None,
           licenses: dict | None = None) -> dict:
    """The card's YAML: configs, the license, and for a one-table export its features and its split. sizes:
    (bytes of the data as a table, bytes of its files), which `datasets` records as the split's `num_bytes`, the
    `dataset_size` and the `download_size`; licenses: {value: rows} of the rows' license column."""
    configs = [{"config_name": name, "data_files": [{"split": "train", "path": files}]}
               for name, files in (("default", fmt.card_files), ("stats", fmt.card_stats)) if files]
    head = {"license": license_id(licenses)} if licenses else {}
    head |= ({"configs": configs} if configs else {}) | {"tags": ["synthetic", "image-generation", "ssdgen"]}
    if schema is not None:
        table_bytes, file_bytes = sizes or (0, 0)
        head["dataset_info"] = {"features": [_yaml_feature(f.name, feature(f.type)) for f in schema],
                                "splits": [{"name": "train", "num_bytes": table_bytes, "num_examples": rows}],
                                "download_size": file_bytes, "dataset_size": table_bytes}
    return head


def license_id(licenses: dict) -> str:
    """The card's `license:` for the rows' license values: the one value, as the Hub spells its identifiers
    (`cc-by-4.0`); `other` for several, or for one that is no identifier (the text lists them)."""
    if len(licenses) == 1:
        (value,) = licenses
        if re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", value.strip().lower()):
            return value.strip().lower()
    return "other"


def public(url: str) -> str:
    """A URL or path as a published card may name it: a local path (or file://) by its file or folder name, a
    remote URL without user, password, query or fragment (a signed URL's token); each part of a chained URL."""
    if "::" in url:
        return "::".join(public(u) for u in url.split("::"))
    scheme, path = fsspec.core.split_protocol(url)
    if scheme in (None, "file", "local"):
        return posixpath.basename(path.rstrip("/")) or path
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _public_spec(spec: str) -> str:
    """A model or decode spec (`kind:/abs/path:key=value`, `ssd:heads=/abs/path`) with its local paths by name."""
    def one(piece: str) -> str:
        key, eq, value = piece.rpartition("=")
        return key + eq + (public(value) if value.startswith(("/", "~")) else value)
    return ":".join(one(p) for p in spec.split(":"))


def _provenance(conf: dict, by: dict) -> list[str]:
    inputs = ", ".join(f"`{public(i['url'])}` ({i['rows']} rows)" for i in conf.get("inputs", [])) or "not recorded"
    return [f"- **Model:** `{_public_spec(str(conf.get('model', '?')))}`",
            f"- **Decoder asked for:** `{_public_spec(str(conf.get('decoder', '?')))}`; **resolved spec that "
            "decoded the rows:** " + ("; ".join(f"`{_public_spec(k)}` ({n} rows)" for k, n in by.items())
                                      or "not recorded"),
            f"- **Settings:** seed {conf.get('seed')}, shard size {conf.get('shard_size')}, image format "
            f"{conf.get('image_format')}, input columns kept: {', '.join(conf.get('columns') or []) or 'none'}",
            f"- **Inputs:** {inputs}"]


def _fidelity(a: dict | None) -> str:
    if not a or a.get("n", 0) == 0 or a.get("nll_gap_ci") is None:
        return ("Not measured in this run: `ssdgen generate --audit FRACTION` measures a lossy decoder's NLL gap "
                "to plain AR on a fraction of the prompts.")
    lo, hi = a["nll_gap_ci"]
    verdict = "within" if a["within_tolerance"] else "NOT within"
    text = (f"NLL gap to plain AR, audited on {a['n']} prompts: {a['nll_gap']:+.4f} nats/token, 95% CI "
            f"[{lo:+.4f}, {hi:+.4f}], {verdict} the tolerance ±{a['tolerance']}.")
    return text + (f" {w}" if (w := warning(a)) else "")


def _licenses(licenses: dict | None) -> list[str]:
    if not licenses:
        return []
    rows = ", ".join(f"`{v}` ({n} input row{'s' if n != 1 else ''})" for v, n in sorted(licenses.items()))
    return [f"- **License** (the rows' `license` column): {rows}"]


def card(src, conf: dict, fmt, shards: list[dict], schema=None, rows: int | None = None,
         sizes: tuple[int, int] | None = None, licenses: dict | None = None) -> str:
    """README.md of an export of the run `src` (an output.layout.Output; its config `conf`, its committed
    shards' manifest rows `shards`) in format `fmt`: counts from the manifest, the resolved specs from the
    commit markers, the audit from summary.json where the run measured one; `sizes` and `licenses` as
    `header` takes them."""
    ok, failed = sum(int(m["ok"] or 0) for m in shards), sum(int(m["failed"] or 0) for m in shards)
    by: Counter = Counter()
    for m in src.iter_markers():
        by[m.decoder or conf.get("decoder", "?")] += m.rows
    left = " Failed prompts have no image and are left out." if fmt.name == "hf" else (
        " Failed prompts have no image; their rows and reasons are in the statistics.")
    audit = (src.read_summary() or {}).get("audit")
    body = [f"# Images generated by ssdgen from `{public(src.url)}`", "",
            f"{ok + failed} prompts, {ok} images, {failed} failed.{left}", "", *_provenance(conf, dict(by)),
            *_licenses(licenses), "",
            "## Fidelity", "", _fidelity(audit), "", "## Loading", "", "```python", "import datasets",
            'ds = datasets.load_dataset("path/to/this/folder", split="train")', "```", ""]
    head = yaml.safe_dump(header(fmt, schema, rows, sizes, licenses), sort_keys=False, allow_unicode=True)
    return "---\n" + head + "---\n\n" + "\n".join(body)
