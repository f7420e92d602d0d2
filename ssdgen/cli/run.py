"""Run commands: generate, serve, status, verify, export, report and demo (README.md, docs/pipeline.md)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Optional

import typer

from ssdgen.cli.options import check_out_files, flow_console, friendly
from ssdgen.cli.run_options import run_settings
from ssdgen.flows.settings import RunSettings

app = typer.Typer()
# the bundled example prompts (reference/data), found without importing the reference model's code
EXAMPLES = str(importlib.resources.files("ssdgen.reference.data").joinpath("example_prompts.parquet"))


@app.command()
@friendly
@run_settings()
def generate(settings: RunSettings,
             overwrite: bool = typer.Option(False, help="delete what --out holds first (the command says what)"),
             progress: bool = typer.Option(True, help="show a progress bar"),
             dry_run: bool = typer.Option(False, "--dry-run", help="check everything and say what the run would do "
                                                                   "(inputs, shards, pending, plan, time and cost); "
                                                                   "start nothing, write nothing")):
    """Generate images for prompts (Parquet, CSV, TSV, JSON, JSON Lines or text files, at any fsspec URL) with a
    Prefect flow on Ray actors; resumable (run it again)."""
    if dry_run:
        return _print_dry_run(settings)
    _run(settings, overwrite, progress)


def _print_dry_run(cfg) -> None:
    from ssdgen.flows.dry_run import dry_run
    d = dry_run(cfg)
    typer.echo(f"dry run: nothing started, nothing written; --out {d['out']}")
    for i in d["inputs"]:
        typer.echo(f"  input {i['url']}: {i['rows']} rows")
    damaged = f", {len(d['damaged'])} damaged (re-decoded)" if d["damaged"] else ""
    typer.echo(f"  {d['rows']} prompts in {d['shards']} shards: {d['committed']} committed, {d['pending']} pending "
               f"({d['pending_rows']} prompts){damaged}")
    typer.echo(f"  input columns kept: {', '.join(d['columns']) or 'none'}")
    if d["added"]:
        a = d["added"]
        ranges = ", ".join(f"{r['url']} rows {r['start']}-{r['stop'] - 1}" for r in a["ranges"])
        typer.echo(f"  --incremental: {a['rows']} rows added since the last run, as new shards "
                   f"{a['shards'][0]}-{a['shards'][1]}: {ranges}")
    if d["changed"]:
        typer.echo(f"  settings differ from the run's recorded ones ({d['changed']}); nothing is committed, so the "
                   "run takes the new ones")
    plan = d["plan"]
    typer.echo(f"  decode plan: {plan['spec']} ({plan['why']})" if plan else
               f"  decode plan: {cfg.decoder} " + ("is decided once at the run's start" if cfg.decoder.calibrated
                                                   else "(concrete: no plan)"))
    _print_estimate(d)


def _print_estimate(d: dict) -> None:
    """The dry run's time and cost, with the digits that matter and where each figure comes from
    (flows/dry_run.py)."""
    from ssdgen.output.cost import usd
    from ssdgen.output.durations import duration
    start = (f"start-up {duration(d['startup_s'])} ({d['startup_source']})" if d["startup_s"] is not None
             else d["startup_source"])
    if not d["pending_rows"]:
        rate = d["images_per_s_per_actor"]
        typer.echo("  estimate: nothing left to decode" + (f" (the rate: {rate:.3g} images/s per actor, "
                                                           f"{d['rate_source']})" if rate else ""))
        return
    if d["seconds"] is None:
        typer.echo(f"  time and cost: {d['rate_source']}; {start}")
        return
    cost = d["usd"]
    typer.echo(f"  estimate: about {duration(d['seconds'])} on {d['actors']} actor(s), start-up included")
    typer.echo(f"    {start}")
    typer.echo(f"    decoding {d['pending_rows']} prompts: {duration(d['decode_s'])} at "
               f"{d['images_per_s_per_actor']:.3g} images/s per actor ({d['rate_source']})")
    typer.echo(f"    cost: {usd(cost['on_demand'])} on demand" + (f", {usd(cost['spot'])} spot" if cost["spot"]
                                                                  is not None else "")
               + f" ({d['device_type']}; the actors' devices for the whole time)")


def _run(cfg, overwrite: bool, progress: bool) -> None:
    """The run (flows.run: checks first, then the flow unless nothing is left to do), and its summary printed."""
    from ssdgen.cli import started
    from ssdgen.flows.run import run
    summary = run(cfg, overwrite, progress, say=typer.echo, around=flow_console, started=started())
    if "images_ok" in summary:  # a run that finished without a summary.json has nothing more to say
        _print_summary(summary)


def _by_reason(s: dict) -> str | None:
    """The failed images counted by error_reason, on one line; None when none failed (or an older summary)."""
    if not (reasons := s.get("errors_by_reason")):
        return None
    return "failed images by reason: " + ", ".join(f"{r} {n}" for r, n in reasons.items())


def _by_decoder(s: dict) -> str | None:
    """The rows counted by the resolved spec that decoded them (the row's `decoder` column), on one line; None
    for a summary from before rows recorded it."""
    if not (by := s.get("rows_by_decoder")):
        return None
    return "rows by resolved decoder: " + ", ".join(f"{spec} {n}" for spec, n in by.items())


def _print_summary(s: dict) -> None:
    from ssdgen.output.cost import cost_table
    typer.echo(f"shards {s['shards_committed']}/{s['shards_total']} committed ({s['shards_run_now']} this run); "
               f"images ok {s['images_ok']}, failed {s['images_failed']}")
    for line in (_by_reason(s), _by_decoder(s)):
        if line is not None:
            typer.echo(f"  {line}")
    from ssdgen.output.audit import audit_rows, warning
    for r in cost_table(s) + audit_rows(s.get("audit")):
        typer.echo(f"  {r['metric']:<34} {r['value']}")
    if (w := warning(s.get("audit"))) is not None:
        typer.echo(f"WARNING: {w}", err=True)
    if (w := (s.get("machine_load") or {}).get("warning")) is not None:
        typer.echo(f"WARNING: {w}", err=True)
    from ssdgen.output.layout import plan_words
    if (how := plan_words(s.get("decode_plan"))) is not None:  # a fall-back to plain AR is said, never silent
        typer.echo(f"decode plan (decided once for this run, _plan.json): {how}")
    if s.get("shards_redecoded"):
        typer.echo(f"re-decoded {len(s['shards_redecoded'])} damaged shard(s): {s['shards_redecoded'][:20]}")
    typer.echo(f"manifest: {s['manifest']}\nsummary:  {s['summary']}")


@app.command()
@friendly
@run_settings(out=None)
def serve(settings: RunSettings, cron: str = typer.Option("0 2 * * *", help="schedule (cron, UTC)"),
          name: str = typer.Option("nightly", help="the Prefect deployment's name")):
    """Serve the generation flow as a Prefect deployment on a cron schedule (runs until stopped)."""
    from pydantic import ValidationError
    from prefect.client.schemas.schedules import CronSchedule

    from ssdgen.flows.prefect_server import NoPrefectServer
    from ssdgen.flows.pipeline import generate as flow
    # every setting checked now, as generate checks them, not at 2 a.m. when the first scheduled run starts
    settings.check()
    try:  # Prefect's own check of the schedule, said in one line
        CronSchedule(cron=cron)
    except ValidationError as e:
        raise ValueError(f"--cron {cron!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    # Prefect's own test before its "Cannot schedule flows on an ephemeral server" warning (Runner.add_flow):
    # without an API URL the schedule lives in a temporary API that has no scheduler, so it would never fire
    from prefect.settings import PREFECT_API_URL
    from prefect.client.orchestration import get_client
    if not (api := PREFECT_API_URL.value()):
        raise NoPrefectServer("a schedule needs a Prefect server: run 'prefect server start' and set "
                              "PREFECT_API_URL=http://127.0.0.1:4200/api (ssdgen serve would otherwise serve a "
                              "cron that never fires)")
    with get_client(sync_client=True) as client:
        if (exc := client.api_healthcheck()) is not None:
            why = type(exc).__name__ + "".join(f": {line}" for line in str(exc).splitlines()[:1])  # one line
            raise NoPrefectServer(f"the Prefect API at PREFECT_API_URL={api} does not answer ({why}); start it "
                                  "with 'prefect server start'")
    from ssdgen.cli.prefect_logs import one_line_reconnects
    with one_line_reconnects():  # a Prefect server's restart is one warning line, not a traceback
        flow.serve(name=name, cron=cron, parameters={"settings": settings.model_dump(mode="json"),
                                                     "progress": False})


def _price_option(name: str):
    """A view's price option (status, report): the run setting's flag and help, read as text (output.cost checks it)."""
    return typer.Option(None, "--" + name.replace("_", "-"), help=RunSettings.model_fields[name].description)


@app.command()
@friendly
def status(url: str = typer.Argument(..., help="a run's output URL"),
           verify: bool = typer.Option(False, "--verify", help="read every committed file back and check its "
                                                               "SHA-256 (default: sizes and ETags only)"),
           prices: Optional[str] = _price_option("prices"), usd_per_hour: Optional[str] = _price_option("usd_per_hour"),
           spot_usd_per_hour: Optional[str] = _price_option("spot_usd_per_hour"),
           as_json: bool = typer.Option(False, "--json", help="print one JSON object for machines (shards, rows, "
                                                              "damaged, failed, pending, plan, cost, audit)")):
    """Shards done, pending, failed and damaged, the decode plan, and the cost so far: at the price the run
    recorded, or at yours (--prices, --usd-per-hour)."""
    from ssdgen.output.layout import plan_words
    from ssdgen.output.reader import run_status
    st = run_status(url, deep=verify, prices=prices, usd_per_hour=usd_per_hour, spot_usd_per_hour=spot_usd_per_hour)
    if as_json:
        import json
        from dataclasses import asdict
        typer.echo(json.dumps(st | {"damaged": [asdict(d) for d in st["damaged"]]}, indent=1, default=str))
        return
    why = " (interrupted: the same generate resumes them)" if st["interrupted"] else ""
    typer.echo(f"{url}: {st['shards_done']} done, {st['shards_pending']} pending{why}, {len(st['shards_failed'])} "
               f"failed of {st['shards_total']} shards; images ok {st['images_ok']}, failed {st['images_failed']}")
    for line in (_by_reason(st), _by_decoder(st)):
        if line is not None:
            typer.echo(f"  {line}")
    for k, v in st["shards_failed"].items():
        typer.echo(f"  failed shard {k}: {v}")
    for d in st["damaged"]:
        typer.echo(f"  damaged: {d} (counted as pending: the same generate re-decodes it)")
    if (how := plan_words(st["decode_plan"])) is not None:
        typer.echo(f"  decode plan: {how}")
    if st["cost"]:
        from ssdgen.output.cost import price_words, usd
        c = st["cost"]  # significant digits: a small run's cost once read $0.0000
        typer.echo(f"  cost so far: {usd(c['usd_on_demand'])} on demand"
                   + (f", {usd(c['usd_spot'])} spot" if c.get("usd_spot") is not None else "")
                   + f" ({c['device_seconds_allocated']:.1f} device-seconds on {c['price']['device_type']})")
        typer.echo(f"  price: {price_words(c['price'])}; "
                   + ("given now: the cost is recomputed at it" if st["price_given"] else "as the run recorded it"))
    from ssdgen.output.audit import audit_rows, warning
    for r in audit_rows(st["audit"]):
        typer.echo(f"  {r['metric']:<34} {r['value']}")
    if (w := warning(st["audit"])) is not None:
        typer.echo(f"WARNING: {w}", err=True)


@app.command("verify")
@friendly
def verify_cmd(url: str = typer.Argument(..., help="a run's output URL"),
               quick: bool = typer.Option(False, help="sizes and ETags only, without reading the files back"),
               read_only: bool = typer.Option(False, "--read-only",
                                              help="only report: set nothing aside, rebuild nothing"),
               repair: bool = typer.Option(False, help="rebuild manifest.parquet and summary.json from the commit "
                                                        "markers even when they look current")):
    """Check every committed file against its commit marker (size and SHA-256); exit 1 if any is damaged.

    Unless --read-only (and refused while a run writes there), a damaged shard's marker is set aside so the next
    `ssdgen generate` re-decodes it, and manifest.parquet and summary.json are rebuilt from the commit markers
    when they do not name exactly the committed shards (after a run whose last writes failed)."""
    if read_only and repair:
        raise ValueError("--repair writes, --read-only does not: give one of them")
    from ssdgen.output.converge import check_run
    r = check_run(url, deep=not quick, read_only=read_only, repair=repair)
    for d in r["damaged"]:
        typer.echo(f"damaged: {d}" + ("" if read_only else " (set aside)"))
    if r["rebuilt"] is not None:
        typer.echo(f"rebuilt manifest.parquet and summary.json from {r['rebuilt']['shards_committed']} commit "
                   f"markers ({r['rebuilt']['rebuilt']['why']})")
    elif r["stale"] is not None:
        typer.echo(f"out of date: {r['stale']}; `ssdgen verify {url}` without --read-only rebuilds them", err=True)
    how = "sizes and ETags" if quick else "size and SHA-256 of every file"
    if r["damaged"]:
        then = "run `ssdgen verify` without --read-only, then" if read_only else "run"
        typer.echo(f"{len(r['damaged'])} of {r['shards']} committed shards damaged ({how}); {then} the same "
                   "`ssdgen generate` to re-decode them", err=True)
        raise typer.Exit(1)
    typer.echo(f"ok: {r['shards']} committed shards checked ({how})")


@app.command()
@friendly
@run_settings(prompts=(EXAMPLES,), shard_size=4, batch_size=8)
def demo(settings: RunSettings):
    """The embedded default job: the bundled example prompts (Parquet) through the Prefect flow on local Ray
    actors into --out (the summary says what the planner chose and why), then a grid.png of the committed images
    with their prompts beside it (out/grid.png for the default out/run; in this folder for an object store).
    Every generate option applies."""
    import io
    import numpy as np
    from PIL import Image
    from ssdgen.reference.grid import captioned_grid
    from ssdgen.output.reader import open_run
    _run(settings, overwrite=False, progress=True)  # a second `make demo` finds nothing to do and ends at once
    rows = [r for r in open_run(settings.out, columns=["prompt", "image"]).to_table().to_pylist() if r["image"]]
    imgs = [np.asarray(Image.open(io.BytesIO(r["image"]["bytes"])).convert("RGB")) for r in rows]
    local = "://" not in settings.out or settings.out.startswith("file://")  # else the grid goes to this folder
    grid = (Path(settings.out.removeprefix("file://")).resolve().parent if local else Path.cwd()) / "grid.png"
    captioned_grid(imgs, [r["prompt"] for r in rows]).save(grid)
    typer.echo(f"{len(imgs)} images -> {settings.out} (shards/*/attempt-*/images.parquet); look at {grid}")


@app.command()
@friendly
def export(url: str = typer.Argument(..., help="a run's output URL (local path, file://, s3://, ...)"),
           to: str = typer.Option(..., "--to", help="folder URL to copy the committed files into"),
           output_format: str = typer.Option("parquet", "--format",
                                             help="parquet (TO/images/*.parquet, TO/stats/*.parquet), webdataset "
                                                  "(TO/{shard:05d}.tar + TO/{shard:05d}.parquet) or hf (one table: "
                                                  "TO/data/*.parquet, ready to push to the Hub); each with a "
                                                  "dataset card, TO/README.md"),
           fresh: bool = typer.Option(False, help="read the commit markers, not manifest.parquet (a run going on)")):
    """Copy a run's committed shards (only those) into a flat folder a data loader, or `datasets.load_dataset`,
    can take."""
    from ssdgen.output.export import export as export_run
    r = export_run(url, to, output_format, fresh=fresh)
    typer.echo(f"exported {r['shards']} committed shards ({r['files']} files, {r['bytes'] / 2**20:.1f} MiB) "
               f"to {r['to']}")


@app.command("report")
@friendly
def report_cmd(url: str = typer.Argument(..., help="a run's output URL (local path, file://, s3://, ...)"),
               html: Path = typer.Option(Path("report.html"), "--html", help="where to write the HTML"),
               samples: int = typer.Option(24, help="images in the sample grid and the heatmaps"),
               prices: Optional[str] = _price_option("prices"),
               usd_per_hour: Optional[str] = _price_option("usd_per_hour"),
               spot_usd_per_hour: Optional[str] = _price_option("spot_usd_per_hour")):
    """A standalone HTML report of a pipeline run, from its committed Parquet and JSON only; its cost at the price
    the run recorded, or at yours (--prices, --usd-per-hour)."""
    from ssdgen.bench.report import write_report
    check_out_files({"--html": html})
    info = write_report(url, html, samples=samples, prices=prices, usd_per_hour=usd_per_hour,
                        spot_usd_per_hour=spot_usd_per_hour)
    typer.echo(f"wrote {html} ({info['shards']} committed shards, {info['images_ok']} images ok, "
               f"{info['images_failed']} failed)")
