"""The Python API, for notebooks and scripts: what `ssdgen generate` and `ssdgen sample` do, as functions that
take the same settings as keyword arguments and run the same checks (a bad value is one ValueError naming the
setting, as the CLI's one `error:` line).

    import ssdgen
    summary = ssdgen.generate(prompts="s3://bucket/prompts/", out="s3://bucket/run", decoder="ar")
    images = ssdgen.sample(["a large red circle at the center on a flat gray background"], n=4)   # PIL images
    table = ssdgen.open_run("s3://bucket/run").to_table()
"""

from __future__ import annotations


def _settings(prompts, out: str, settings: dict):
    from pydantic import ValidationError

    from ssdgen.flows.settings import RunSettings
    prompts = (prompts,) if isinstance(prompts, str) else tuple(str(p) for p in prompts)
    try:
        return RunSettings(prompts=prompts, out=str(out), **settings)
    except ValidationError as e:
        err = e.errors()[0]
        name = ".".join(str(x) for x in err["loc"]) or "settings"
        raise ValueError(f"{name}: {_message(err)}") from None


def _message(err: dict) -> str:
    """A pydantic error in the words of its cause: a validator's own ValueError as it was raised, without
    pydantic's "Value error, " before it; pydantic's own message otherwise."""
    cause = (err.get("ctx") or {}).get("error")
    return str(cause) if err["type"] == "value_error" and cause is not None else err["msg"]


def generate(prompts, out: str, *, overwrite: bool = False, progress: bool = False, **settings) -> dict:
    """Run the generation flow over `prompts` (a URL, or a list of them: files, prefixes or globs) into `out`,
    as `ssdgen generate` does, and return the run's summary (summary.json). `settings` are RunSettings' fields
    by name (decoder="ar", shard_size=256, actors=2, keep_columns=("license",), ...; `ssdgen generate -h`).
    Resumable: the same call again decodes only what is not committed. Prefect runs as under the CLI: without a
    configured API, a temporary server started before Prefect is imported (flows/prefect_server.py)."""
    import time

    from ssdgen.flows.prefect_server import temporary_api
    from ssdgen.flows.run import run
    started = time.time()  # the call's start: the summary's end-to-end figures count from it
    return run(_settings(prompts, out, settings), overwrite=overwrite, progress=progress, say=print,
               around=temporary_api, started=started)


def sample(prompts, n: int = 1, *, seed: int = 0, decoder: str = "ssd+csd", model: str | None = None,
           device: str = "cpu", dtype: str = "auto") -> list:
    """Images for `prompts` (a caption or a list), `n` each, as PIL images in prompt order, decoded in this
    process as `ssdgen sample` does: seeds count up from `seed`; a calibrated decoder is planned on this batch."""
    from PIL import Image

    from ssdgen.decoders import build
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.models.registry import load_model
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    m = load_model(model, device=device, dtype=dtype)
    batch = [p for p in prompts for _ in range(n)]
    seeds = [seed + i for i in range(len(batch))]
    m.validate_prompts(batch)
    from ssdgen.workers.cpus import governed
    with governed(m):  # threads follow what other processes leave, as `ssdgen sample`'s (workers/cpus.py)
        dec = build(DecodeSpec.parse(decoder), m).resolve(batch, seeds, len(batch))
        res = dec.decode(batch, seeds)
    return [Image.fromarray(img) for img in m.decode_images(res.tokens).numpy()]
