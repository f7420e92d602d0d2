"""What an actor returns for a batch: typed records the flow reads by attribute, never by string.

A `Sample` is one prompt's outcome (its image bytes, token grid and statistics, or its error); a `BatchResult`
holds a batch's samples keyed by prompt_id (in the batch's order), with the decoder that made them (the rows'
provenance), the batch's busy time, its audit rows and the actor's load time and whereabouts. The flow pairs
each sample with its input row by prompt_id (output.layout.shard_tables), never by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# error_reason codes of the rows the pipeline itself fails; a refused prompt's come from the model
# (decoders/protocol.py: empty, no_known_words, unknown_words, too_long, grammar, invalid_prompt)
BAD_INPUT = "bad_input"  # the input row itself: a null prompt, invalid UTF-8 (inputs.shards)
DECODE_FAILED = "decode_failed"  # the decoder raised on this sample
UNRECORDED = "unrecorded"  # a row that failed with no reason recorded: a run from before reasons existed


@dataclass(frozen=True)
class Sample:
    prompt_id: str
    status: str  # "ok" | "error"
    error: str | None = None
    image: bytes | None = None  # encoded as the run's image_format
    width: int | None = None
    height: int | None = None
    tokens: list[int] | None = None  # the image token grid, raster order
    grid: tuple[int, int] | None = None  # (rows, columns) of tokens
    stats: dict | None = None  # decoders.sample_stats.SampleStats.to_row()
    latency_s: float = 0.0  # this sample's share of its decode call
    error_reason: str | None = None  # a short code for why it failed, counted by the run's summary

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, prompt_id: str, message: str, reason: str) -> "Sample":
        return cls(prompt_id, "error", message, error_reason=reason)


@dataclass(frozen=True)
class BatchResult:
    samples: dict[str, Sample]  # prompt_id -> sample, in the batch's order
    decoder: str  # str(Decoder) of the decoder that ran: the resolved spec the rows record
    fell_back: bool  # a speculative request decoded as plain AR (its plan chose AR)
    busy_s: float  # the batch's decode and encode, without the audit
    audit: list[dict] = field(default_factory=list)  # output.audit's rows for the rows marked to audit
    audit_s: float = 0.0
    load_s: float = 0.0  # this actor incarnation's model load, on its first batch only
    worker: dict = field(default_factory=dict)  # {pid, node_id, device}: where it ran
