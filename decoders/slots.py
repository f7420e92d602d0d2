"""Continuous batching: a decode call's prompts stream through B slots instead of waiting in fixed batches.

A fixed batch waits for its slowest sample: the window loop's samples finish at different forwards, and the packed
step makes a finished row free but leaves it idle until the batch is done. Here a slot whose sample is done takes
the next prompt at the next step: its cache rows (the conditional row and, under CFG, its unconditional pair,
which the model keeps together: `model.admit`) are prefilled with the new prompt in the same forward as the other
slots' step, packed into the model's ragged step. Only when the queue is empty does a slot idle.

    stream  per step: harvest the slots whose sample is done (`SlotLoop.harvest`), give the free slots the next
            prompts (`Slots.refill`), run one forward of every slot with the newcomers' prefill packed into it
            (`SlotLoop.forward(admission)`), start the newcomers from their prefill's output (`SlotLoop.admit`)

Exactness: a sample's tokens are the ones it gets in a fixed batch, whatever its slot, its batch-mates and the step
it was admitted at. Its random numbers are keyed by its own seed and counters its own progress sets (sampling.py;
`Streams.admit` rekeys a slot), every per-sample state a loop holds (tokens, committed counts, drafts, the heads'
hidden states, the coupled noise, window sizes, the tally) starts as a fresh batch's (each loop's `admit`), and its
keys and values are its own: the model writes each index before the first query that sees it, and masks the
previous sample's keys past that point (protocol.py `admit`). tests/test_slots.py checks it for every loop.

Which loops stream (`SLOT_LOOPS`): plain AR (ar.ARSlots) and the window loop (window.py, so sjd, csd, ssd and
ssd+csd); the block decoder (commit=block, lossy) decodes fixed batches only and refuses slots. The statistics say
how busy the slots were (stats.Occupancy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from .ar import ARSlots
from .protocol import ImageTokenModel, StepOutput, check_request
from .recipes import SamplingConfig
from .sample_stats import SampleStats
from .sampling import model_device
from .stats import DecodeResult, Occupancy
from .window import start_window


@dataclass
class Admission:
    """Prompts that take free slots at one step."""

    rows: torch.Tensor  # [R] the slots, on the model's device
    at: list[int]  # the same slots, on the host
    prompts: list[str]
    seeds: list[int]


class SlotLoop(Protocol):
    """A loop's batch state over B slots (ar.ARSlots, window._Jacobi), made by prefilling the first B prompts."""

    packs: bool  # whether `forward` takes an admission packed into its step (else: a prefill forward of its own)

    def done(self) -> list[bool]:
        """[B] whether each slot's sample holds all its tokens (an idle slot's too)."""

    def harvest(self, b: int) -> tuple[torch.Tensor, SampleStats]:
        """Slot b's finished sample: its tokens [H*W] and statistics."""

    def forward(self, admit: Admission | None = None) -> StepOutput | None:
        """One step of the running samples, with admit's prefill packed into it (only where `packs`) -> the
        prefill's output [R, 1] (None without)."""

    def idle_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, index, lengths) of a step in which no slot feeds anything (a prefill forward of its own)."""

    def admit(self, admit: Admission, pre: StepOutput) -> None:
        """The admitted slots start their samples from their prefill's output pre [R, 1]."""


class Slots:
    """The queue and the slots: which prompt each slot decodes, the finished samples in prompt order, and the
    slot-forwards that did work."""

    def __init__(self, prompts: list[str], seeds: list[int], slots: int, tokens: int, device: torch.device):
        """The first `slots` prompts are in their slots already (the loop's start prefilled them)."""
        self.prompts, self.seeds, self.B = prompts, seeds, slots
        self.sample = list(range(slots))  # [B] host: the prompt each slot decodes (-1: none)
        self.queued = slots  # the next prompt to admit
        self.tokens = torch.zeros(len(prompts), tokens, dtype=torch.long, device=device)  # [P, H*W]
        self.stats: list[SampleStats | None] = [None] * len(prompts)
        self.occupancy = Occupancy(slots, 1, slots)  # the start's prefill: every slot

    @property
    def running(self) -> int:
        """Slots that hold a sample."""
        return sum(s >= 0 for s in self.sample)

    def keep(self, done: list[bool], loop: SlotLoop) -> None:
        """Take the finished samples out of their slots."""
        for b, finished in enumerate(done):
            if finished and self.sample[b] >= 0:
                self.tokens[self.sample[b]], self.stats[self.sample[b]] = loop.harvest(b)
                self.sample[b] = -1

    def refill(self) -> Admission | None:
        """The next prompts into the free slots, in slot order (None: no slot is free, or the queue is empty)."""
        free = [b for b, s in enumerate(self.sample) if s < 0][:len(self.prompts) - self.queued]
        if not free:
            return None
        take = list(range(self.queued, self.queued + len(free)))
        self.queued += len(free)
        for b, i in zip(free, take):
            self.sample[b] = i
        return Admission(torch.tensor(free, dtype=torch.long, device=self.tokens.device), free,
                         [self.prompts[i] for i in take], [self.seeds[i] for i in take])

    def ran(self, busy: int) -> None:
        """One model forward in which `busy` slots worked."""
        self.occupancy.forwards += 1
        self.occupancy.busy += busy

    def result(self, seconds: float) -> DecodeResult:
        """Tokens [P, H*W] and statistics in prompt order; seconds: the call's wall-clock share of each sample."""
        for st in self.stats:
            st.seconds = seconds
        return DecodeResult(self.tokens, self.stats, self.occupancy)


def stream(model: ImageTokenModel, loop: SlotLoop, slots: Slots) -> None:
    """Step the loop until every prompt is decoded (module doc)."""
    while True:
        slots.keep(loop.done(), loop)
        running = slots.running  # before the newcomers: the slots whose samples step
        admission = slots.refill()
        if slots.running == 0:
            return
        if admission is not None and not (loop.packs and running):
            # a prefill forward of its own, every other slot feeding nothing: the loop's step cannot carry it (its
            # `packs` says why), or no slot steps beside it; the newcomers then join the step below
            _, pre = model.admit(admission.rows, admission.prompts, *loop.idle_step())
            slots.ran(len(admission.at))
            loop.admit(admission, pre)
            running, admission = running + len(admission.at), None
        if admission is None:
            loop.forward()
            slots.ran(running)
        else:
            loop.admit(admission, loop.forward(admission))
            slots.ran(running + len(admission.at))

def _ar(model, prompts, seeds, sc, cfg, heads) -> SlotLoop:
    return ARSlots(model, prompts, seeds, sc)


# a recipe's loop (recipes.LOOP_NAMES) -> (model, the first B prompts and seeds, sampling, config, heads) -> SlotLoop
SLOT_LOOPS = {"ar": _ar, "window": start_window}


def decode_slots(loop: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
                 cfg, heads, slots: int) -> DecodeResult:
    """Decode prompts through `slots` slots by the recipe's loop (module doc) -> tokens [P, H*W] in prompt order,
    their statistics, and the slots' occupancy."""
    if loop not in SLOT_LOOPS:
        raise ValueError(f"unsupported combination: continuous batching (slots={slots}) runs plain AR and the window "
                         f"loop, not the {loop} loop; the block decoder (commit=block) decodes fixed batches only: "
                         "decode with slots=None, or with commit=prefix")
    if not model.capabilities.admit:
        raise ValueError(f"model {model.name!r} cannot take a prompt into a running batch (Capabilities.admit), "
                         f"which continuous batching (slots={slots}) needs: decode with slots=None")
    check_request(model, prompts, seeds, sc.greedy, cfg is not None and cfg.relax.active)
    t0 = time.perf_counter()
    state = SLOT_LOOPS[loop](model, prompts[:slots], seeds[:slots], sc, cfg, heads)
    book = Slots(prompts, seeds, slots, model.grid[0] * model.grid[1], model_device(model))
    stream(model, state, book)
    return book.result((time.perf_counter() - t0) / len(prompts))
