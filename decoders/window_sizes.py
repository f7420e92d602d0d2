"""How many tokens each sample feeds at each forward of the window loop (window.py): its window L_b.

Fixed windows (the default): L_b = the config's window for every sample. Adaptive windows (`adaptive=true`):
each sample's window follows its own acceptance, by the schedule of HF's assisted generation (its "heuristic"
number of candidate tokens): GROW more after a forward that accepted every draft, SHRINK fewer after one that
rejected a draft, within [MIN_WINDOW, window]. A sample in a smooth region, whose drafts keep being accepted,
verifies far ahead; one in a detailed region, whose drafts are rejected early, feeds a few tokens instead of
the whole window. The window is a function of the sample's own history only, so a sample decodes the same in any
batch; and it is fixed before the forward it sizes, so what is verified is a prefix chosen in advance (lossless
verification holds for any such prefix, as for speculative decoding with a varying number of drafts).
Either way a window never runs past the image (L_b <= N - n_b + 1), and a finished sample feeds nothing (0):
with the packed model step (protocol.step's lengths) neither costs the forward anything.
"""

from __future__ import annotations

import torch

MIN_WINDOW = 2  # the last committed token and one draft
GROW, SHRINK = 2, 1  # HF's heuristic schedule: +2 candidates after a fully accepted forward, -1 after a rejection


class WindowSizes:
    """The batch's windows [B], updated after every forward from each sample's accepted drafts."""

    def __init__(self, batch: int, window: int, adaptive: bool, dev: torch.device):
        self.window, self.adaptive = window, adaptive
        # the windows each sample would feed, before the image's end: adaptive ones start at the full window
        self.want = torch.full((batch,), window, dtype=torch.long, device=dev)  # [B]

    def observe(self, n_accepted: torch.Tensor, judged: torch.Tensor, active: torch.Tensor) -> None:
        """This forward's accepted drafts [B] out of judged [B] per sample; finished samples keep their state."""
        if self.adaptive:
            step = torch.where(n_accepted >= judged, GROW, -SHRINK)
            self.want = torch.where(active, (self.want + step).clamp(MIN_WINDOW, self.window), self.want)

    def lengths(self, n: torch.Tensor, N: int) -> torch.Tensor:
        """[B] tokens each sample feeds next, given its committed count n [B]: 0 once it has all N."""
        return torch.where(n < N, torch.minimum(self.want, N - n + 1), 0)
