"""What a run checks and reads before Prefect or Ray start: every setting, the output, the inputs, the shards
and what is already committed. The CLI calls it first, so a mistake costs one `error:` line and no server start,
and a run with nothing to do ends in a second; the flow calls it again (a deployment has no CLI in front).

Nothing here writes: the writes (config, setting damaged shards aside, overwrite) happen in the flow, under the
output's lease (output.lease).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ssdgen.inputs.files import InputFile, check_seeds, check_unique_prompt_ids, list_inputs, with_identities
from ssdgen.inputs.growth import added_rows
from ssdgen.inputs.shards import Range, Shards, recorded_segments
from ssdgen.output.converge import stale
from ssdgen.output.cost import Price
from ssdgen.output.folder import check_usable, is_inside
from ssdgen.output.layout import ROW_DIGESTS, Output
from ssdgen.output.lease import Lease
from ssdgen.output.damage import Damage, committed_state
from .settings import RunSettings


@dataclass
class Prepared:
    cfg: RunSettings
    price: Price
    files: list[InputFile]
    shards: Shards
    out: Output
    done: bytearray  # done[i] == 1: shard i is committed (and passed the cheap check)
    damaged: list[Damage] = field(default_factory=list)
    changed: str | None = None  # settings a run that committed nothing will take anew
    stale: str | None = None  # with nothing to decode: why the manifest or summary lags the markers (output.converge)
    record: dict = field(default_factory=dict)  # what _config.json will hold (RunSettings.recorded, the segments)
    old: dict | None = None  # what it holds now
    added: list[Range] | None = None  # --incremental over grown inputs: the rows added (the shards' last segment)

    @property
    def pending(self) -> int:
        return self.done.count(0)

    @property
    def committed(self) -> int:
        return len(self.done) - self.pending

    @property
    def pending_rows(self) -> int:
        return sum(self.shards.rows_of(i) for i, d in enumerate(self.done) if not d)

    @property
    def added_shards(self) -> range:
        """The shards of the rows --incremental added this run (empty when it added none)."""
        return range(self.shards.first[-2], len(self.shards)) if self.added else range(0)


def check_output(cfg: RunSettings) -> Output:
    """The output URL is usable (`Output.check_usable`: create-only, not a file, its bucket there) and not inside
    a --prompts folder (the run would list its own files as prompts)."""
    try:
        out = Output(cfg.out)
    except (ValueError, ImportError) as e:
        raise ValueError(f"--out {cfg.out}: {e}") from None
    check_usable(out, f"--out {cfg.out}")
    for p in cfg.prompts:
        if is_inside(out, p):
            raise ValueError(f"--out {cfg.out} is inside --prompts {p}: the run would read its own output as "
                             "prompts; put the output elsewhere")
    return out


def prepare(cfg: RunSettings, overwrite: bool = False, leased: bool = False) -> Prepared:
    """Check everything and read the run's state; raises ValueError / InputError / StorageError with one line.
    `leased`: the caller holds the output's lease (the flow), so it is not asked who holds it."""
    price = cfg.check()
    out = check_output(cfg)
    if not leased:
        Lease(out).check_free()  # a second driver on this output is refused before it starts anything
    files = with_identities(list_inputs(list(cfg.prompts), read_as=cfg.read_as))
    check_unique_prompt_ids(files)
    check_seeds(files)
    cfg.kept_columns(files)  # a clash with an output column, or a typo in --keep/--drop-columns: one line, now
    if overwrite:  # everything there goes (flows.pipeline, under the lease): nothing to compare
        shards = Shards(files, cfg.shard_size)
        return Prepared(cfg, price, files, shards, out, bytearray(len(shards)), record=cfg.recorded(files))
    recorded = cfg.recorded(files)
    old = out.recorded_config()
    if old is not None and not any("content" in i for i in old.get("inputs", [])):
        for i in recorded["inputs"]:  # a run recorded before inputs had a content identity: compare the rest
            i.pop("content", None)
    if old is not None and "columns" not in old and not recorded["columns"]:
        recorded.pop("columns")  # a run recorded before input columns were kept, and none are kept now
    segments, added = _segments(cfg, old, recorded, files)
    if segments and len(segments) > 1:  # shards that grew (inputs.shards): every later run rebuilds it from here
        recorded["segments"] = [[list(r) for r in seg] for seg in segments]
    shards = Shards(files, cfg.shard_size, segments)
    # one listing; every marker read and checked, unless nothing under shards/ changed since the last run checked it
    done, damaged, markers = committed_state(out, len(shards))
    pinned = bool(done.count(1) or damaged)
    # grown inputs (--incremental) are the old run's, rows added: every other setting must still match
    compared = old if added is None else old | {k: recorded.get(k) for k in ("inputs", "segments")}
    changed = out.check_config(recorded, compared, pinned)
    why = stale(out, markers) if not done.count(0) else None
    return Prepared(cfg, price, files, shards, out, done, damaged, changed, why, recorded, old, added)


def _segments(cfg: RunSettings, old: dict | None, recorded: dict,
              files: list[InputFile]) -> tuple[list[list[Range]] | None, list[Range] | None]:
    """(The shards' segments, by file URL, None for every file whole; the rows added, where --incremental
    takes grown inputs, else None). Inputs as recorded: the recorded segments. Grown, with --incremental: those
    and a segment of the added rows (inputs.growth; changed or removed rows are one InputError). Changed without
    it: every file whole, which check_config refuses once a shard is committed, naming the input."""
    if old is None:
        return None, None
    inputs = old.get("inputs") or []
    if inputs == recorded["inputs"]:
        return (recorded_segments(inputs, old["segments"]) if old.get("segments") else None), None
    if not cfg.incremental:
        return None, None
    added = added_rows(inputs, recorded["inputs"], old.get(ROW_DIGESTS), files)
    return recorded_segments(inputs, old.get("segments")) + ([added] if added else []), added


def describe(p: Prepared) -> str:
    """One line: what the run will do."""
    return (f"{p.shards.rows} prompts in {len(p.files)} file(s): {len(p.shards)} shards, {p.committed} already "
            f"committed, {p.pending} to run" + (f" ({len(p.damaged)} damaged, re-decoded)" if p.damaged else "")
            + (f"; --incremental: {sum(b - a for _, a, b in p.added)} rows added since the last run, as shards "
               f"{p.added_shards[0]}-{p.added_shards[-1]}" if p.added else ""))
