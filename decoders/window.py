"""The window loop: the default decoder (ssd+csd), and SJD, CSD and lossless SSD, which are configurations of it.

One iteration, per sample b with n_b tokens committed (see docs/algorithms.md §1):
  1. window = [last committed token] + K = L - 1 drafts for indices n_b .. n_b + K - 1;
  2. one forward over the window gives q for each draft and for the bonus position;
  3. `verify` accepts a prefix of the drafts and draws the resampled or bonus token after it;
  4. commit; the target's own samples at the positions after the commit point (Jacobi updates) become
     the next drafts, with their q as draft distribution; the window is topped up with fresh drafts
     by a `Drafter` (drafters.py).
The configurations (the recipe table, recipes.RECIPES: drafter x acceptance over one WindowConfig):
  sjd      cfg.init's guesses (random: a uniform token; repeat-left / repeat-above: the neighbour), one-hot p;
           the lossless rule
  csd      the same drafts; CSD's relaxation (verify.py), within tolerance of AR
  ssd      SSD's spatial heads (drafters.HeadsDrafter), their drafts with their distributions, over a window of
           `rows` raster rows (L = rows * W + 1, at most 64), Gumbel-coupled; the lossless rule (`lossless=true`
           says the same)
  ssd+csd  the same window and drafts; CSD's relaxation (the default decoder)
What a window verifies but cannot yet commit is kept for the next forward instead of being drafted again.
`coupled=True` draws the Jacobi updates by Gumbel-max with one fixed noise vector per position instead of
fresh noise. A draft whose context has settled then stops changing from one forward to the next, so the
drafts ahead of the commit point converge to the tokens they will be judged as, instead of being redrawn
every forward. It stays lossless: the noise at index j only ever draws the draft of j, and the draft
distribution q_j at judgement depends only on indices < j, so the draft is an exact sample of q_j; the
accept test and the residual draw use fresh uniforms.
Each sample advances by its own accepted length: no minimum over the batch. The KV cache is
position-indexed, so a sample's rollback is just its next window starting at its own n_b.
Randomness is counter-based (sampling.py): a forward's uniforms are keyed by the sample's seed and its own forward
number (which its own progress sets), and the coupled noise by its seed and the image index, so a sample's
tokens do not depend on its batch-mates, and the whole batch's numbers come from one set of tensor ops.

Two options, off by default, live here too because only this loop has them:
- Adaptive windows (`adaptive=true`, `WindowSizes`): each sample's window L_b follows its own acceptance, by the
  schedule of HF's assisted generation: GROW more after a forward that accepted every draft, SHRINK fewer after
  one that rejected a draft, within [MIN_WINDOW, window]. It is a function of the sample's own history only (the
  same in any batch), fixed before the forward it sizes, so what is verified is a prefix chosen in advance, for
  which lossless verification holds. Fixed or adaptive, a window never runs past the image (L_b <= N - n_b + 1),
  a finished sample feeds nothing, and with the packed step (protocol.step's lengths) neither costs anything.
- Proactive drafting (`branches=K`, `Branches`; after SJD-PAC): after a rejection the window's first draft was
  drafted from a context that held the rejected token and is accepted about half the time (48% for lossless ssd
  on the bundled model), and when it is accepted the drafts behind it usually are too. So the window gets K - 1
  side branches that differ from it in that one token only, verified in the same forward by tree attention:

      main      [y, x_n, x_n+1, ..., x_n+L-2]     y: the last committed token, x: the window's drafts
      branch k  [   c_k, x_n+1, ..., x_n+D-1]     c_k: the k-th most likely token of x_n's draft distribution
                                                  other than x_n; the rest are the main window's own drafts

  Each branch sees the committed prefix, y and its own earlier entries (gpt.tree_mask); the model caches a
  branch's keys at scratch slots after the window. Verification stays exact: the main window is verified as
  without branches; if its first draft is rejected, the candidates are tested in turn against the residual it
  left (verify.verify_candidates: SpecInfer's recursive rejection sampling with deterministic drafts), the first
  accepted one wins, its branch's drafts are verified by the standard rule and its accepted keys and values are
  copied to their positions (model.copy_cache); if none is accepted, the token is drawn from the last residual.
  The candidates are fixed before the forward and every test uses its own uniform, so each committed token is a
  sample from the target given the tokens before it (tests/test_branches.py checks the distribution).

Continuous batching (slots.py) runs this loop over B slots: `start_window` makes the state of the first B prompts,
and `_Jacobi`'s slot methods give a finished sample's slot the next prompt, its prefill packed into the next
forward (`forward(admit)`), every per-sample state started as `start_window` starts it (`admit`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .drafters import DRAFTERS, Drafter
from .protocol import ImageTokenModel, StepOutput, check_request
from .recipes import Relaxation, SamplingConfig, WindowConfig, branch_tokens
from .sample_stats import COMMIT_ACCEPTED, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED, SampleStats
from .sampling import (PositionNoise, Purpose, Streams, gumbel_sample, model_device, next_probs, prefill,
                       processed_probs, sample_from)
from .stats import DecodeResult, Occupancy, Tally
from .verify import Verdict, entropy, residual, verify, verify_all, verify_candidates


@torch.no_grad()
def decode_window(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
                  cfg: WindowConfig = WindowConfig(), heads=None) -> DecodeResult:
    """Decode by the window loop as `cfg` configures it (module doc): a window of cfg.tokens(W) tokens, drafted
    by cfg.drafter (drafters.DRAFTERS; heads: SSD's, for the heads drafter) and accepted by cfg.relax."""
    check_request(model, prompts, seeds, sc.greedy, cfg.relax.active)
    t0 = time.perf_counter()
    jac = start_window(model, prompts, seeds, sc, cfg, heads)
    forwards = 1  # the prefill
    while (jac.n < jac.N).any():
        jac.forward()
        forwards += 1
    B = len(prompts)
    stats = jac.tally.stats(model.grid, (time.perf_counter() - t0) / B, jac.settings)
    busy = int(jac.tally.forwards.sum())  # each sample's forwards, its prefill included: the rows that worked
    return DecodeResult(jac.buf[:, :jac.N].clone(), stats, Occupancy(B, forwards, busy))


def start_window(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
                 cfg: WindowConfig, heads=None) -> _Jacobi:
    """The batch's state after the prefill and the first window's drafts (a fixed batch's, or a stream's first B
    prompts: slots.py); the prompts are checked by the caller."""
    dev = model_device(model)  # every buffer and key below lives on it
    streams = Streams(seeds, dev)
    N, L = model.grid[0] * model.grid[1], cfg.tokens(model.grid[1])
    drafter = DRAFTERS[cfg.drafter](model, sc, cfg, heads, len(prompts), N + L + 2)
    if cfg.branches > 1 and not model.capabilities.tree_attention:
        raise ValueError(f"branches={cfg.branches} verifies its candidates by tree attention, which model "
                         f"{model.name!r} does not have (the reference model does): set branches=1")
    jac = _Jacobi(model, sc, cfg, L, drafter, streams, dev)
    out, q0, jac.buf[:, 0] = prefill(model, prompts, sc, streams)
    jac.tally.ent_sum += entropy(q0)
    drafter.begin(out)
    jac.first_window()
    return jac


def _settings(cfg: WindowConfig, L: int, drafter: Drafter, branches: "Branches | None") -> dict:
    """The decoder settings every sample's statistics record (`extra`)."""
    extra = {"window": L, "init": drafter.name, "coupled": cfg.coupled, "lam": cfg.relax.lam,
             "delta": cfg.relax.delta, "window_sizes": "adaptive" if cfg.adaptive else "fixed",
             "packed": cfg.packed} | ({"branches": cfg.branches, "branch_len": branches.D_max} if branches else {})
    if cfg.spatial:  # the settings of a drafter in raster rows (SSD's heads)
        extra |= {"rows": cfg.rows, "lossless": not cfg.relax.active, "commit": "prefix", "two_d": cfg.two_d}
    return extra


class _Jacobi:
    """The batch's state between forwards: committed tokens and current drafts, the drafts' distributions and
    each sample's committed count; `forward` runs one iteration of the module doc's steps 1-4."""

    def __init__(self, model: ImageTokenModel, sc: SamplingConfig, cfg: WindowConfig, L: int, drafter: Drafter,
                 streams: Streams, dev: torch.device):
        B, (H, W) = len(streams.key), model.grid
        self.model, self.sc, self.relax, self.drafter, self.streams = model, sc, cfg.relax, drafter, streams
        self.N, self.K, self.V = H * W, L - 1, model.n_codes
        N, K = self.N, self.K
        self.rows = torch.arange(B, device=dev)
        self.slots = torch.arange(K + 1, device=dev)  # window slots 0 .. K
        self.offsets = self.slots[:K]  # draft slots 0 .. K - 1
        self.noise = PositionNoise(streams.base(Purpose.NOISE), self.V, span=K + 1) if cfg.coupled else None
        self.buf = torch.zeros(B, N + K + 1, dtype=torch.long, device=dev)  # committed tokens, then the current drafts
        self.p: torch.Tensor | None = None  # [B, K, V] draft distribution of each window slot (first_window)
        self.n = torch.ones(B, dtype=torch.long, device=dev)  # tokens committed per sample
        self.t = torch.zeros(B, dtype=torch.long, device=dev)  # forwards per sample: its uniforms' counter
        self.tally = Tally(B, N + K + 1, dev, hist_bins=K + 2, cfg=sc.uses_cfg)
        self.sizes = WindowSizes(B, L, cfg.adaptive, dev)
        self.packed, self.continuation = cfg.packed, cfg.continuation
        self.branches = Branches(cfg.branches, cfg.branch_len, L) if cfg.branches > 1 else None
        if self.branches and not self.packed:
            raise ValueError("branches need the packed step (packed=true): their entries are laid out per sample")
        self.L = torch.zeros_like(self.n)  # [B] tokens each sample feeds next (first_window, then _advance)
        self.settings = _settings(cfg, L, drafter, self.branches)

    def first_window(self, new: torch.Tensor | None = None) -> None:
        """Fresh drafts for the first window, after the prefill's token 0: every sample's, or those of the samples
        where new [B] holds (slots that took new samples; the others keep their own)."""
        n, K = self.n, self.K
        u_init = self.streams.uniform(Purpose.SJD_FIRST, 0, width=K)  # [B, K]
        L = self.sizes.lengths(n, self.N)
        first = torch.zeros_like(n) if new is None else torch.where(new, 0, K)  # K: a sample drafts nothing
        p = self.drafter.draft(self.buf, n, first, (L - 1).clamp(min=0), u_init)
        if new is None:
            self.L, self.p = L, p
        else:
            self.L, self.p = torch.where(new, L, self.L), torch.where(new[:, None, None], p, self.p)

    def _feed(self) -> tuple[int, torch.Tensor | None]:
        """(slots fed per row S, the model's lengths): the packed step feeds each sample its own window L_b,
        padded to the batch's widest (None when every row is that wide); the padded one the whole window."""
        if not self.packed:
            return self.K + 1, None
        lo, hi = torch.stack([self.L.min(), self.L.max()]).tolist()  # the loop's one host sync per forward
        return max(hi, 1), (None if lo == hi else self.L)

    def forward(self, admit=None) -> StepOutput | None:
        """One iteration (module doc); admit (slots.Admission, with `packs` only): prompts prefilled into their
        finished slots in the same forward -> their prefill's output [R, 1] (None without)."""
        N, n, rows, L = self.N, self.n, self.rows, self.L
        S, lengths = self._feed()
        K = S - 1  # drafts fed this forward (the config's K when padded)
        active = n < N
        idx = (n - 1)[:, None] + self.slots[:S]  # [B, S] window indices, may run past N
        tokens = self.buf[rows[:, None], idx]  # [B, S]
        lay = side = pre = None
        if admit is not None:  # the admitted slots are finished (L = 0): the model replaces their rows
            out, pre = self.model.admit(admit.rows, admit.prompts, tokens, idx, L if self.packed else None)
        elif self.branches is None:
            out = self.model.step(tokens, idx, lengths)
        else:  # the main windows and their side branches in one forward (Branches, below)
            lay = self.branches.lay_out(tokens, idx, L, self.p)
            out, side = self.branches.step(self.model, lay, S)
        fed = self.slots[:S][None, :] < L[:, None]  # [B, S] a sample's own window; the rest is padding
        self.drafter.observe(out, idx, fed)
        q = processed_probs(out.cond, out.uncond, self.sc)  # [B, S, V]
        # keyed by (seed, the sample's forward number): accept K, resample 1, Jacobi K+1, init K (config's K)
        Kc = self.K
        u = self.streams.uniform(Purpose.SJD_STEP, self.t, width=3 * Kc + 2)  # [B, 3K+2]
        u_acc, u_res, u_jac, u_init = u[:, :K], u[:, Kc], u[:, Kc + 1:Kc + 1 + S], u[:, 2 * Kc + 2:]
        n_valid = (L - 1).clamp(min=0)  # [B] drafts judged: the sample's window, which stops at the image's end
        v = verify(tokens[:, 1:], self.p[:, :K], q, n_valid, u_acc, u_res, self.relax)
        if lay is not None:
            u_br = self.streams.uniform(Purpose.BRANCH, self.t, width=self.branches.C)  # [B, C]
            q_side = processed_probs(side.cond, side.uncond, self.sc)  # [B, C, D_max, V]
            v, q, won = self.branches.resolve(lay, v, q, q_side, tokens, self.p, n_valid, u_acc, u_res, u_br,
                                              self.relax, active)
            self.branches.commit(lay, won, torch.where(active, v.n_accepted, 0), side, self.model, self.drafter,
                                 self.buf)
        self.t = self.t + active.long()  # finished samples' numbers are never used
        if self.noise is not None:  # q[:, s] is the distribution of index idx[:, s] + 1
            jacobi = gumbel_sample(q, self.noise.rows((idx + 1).clamp(max=N + Kc), active))  # [B, S]
        else:
            jacobi = sample_from(q, u_jac)  # [B, S] the target's own sample at every window position
        if self.continuation and S > 1:  # past the commit point, each draft kept or resampled (module doc)
            kept, _, _ = verify_all(tokens[:, 1:], self.p[:, :K], q[:, :K], fed[:, 1:], u_acc, u_jac[:, :K])
            jacobi = torch.cat([torch.where(fed[:, 1:], kept, jacobi[:, :K]), jacobi[:, K:]], 1)
        n_acc = torch.where(active, v.n_accepted, 0)  # [B]
        width = (L if lay is None else lay.lengths) if self.packed else S
        self._record(v, q, n_acc, n_valid, active, width)  # the tokens computed
        self.sizes.observe(n_acc, n_valid, active)
        self._advance(v, q, jacobi, n_acc, u_init, active)
        return pre

    def _record(self, v: Verdict, q: torch.Tensor, n_acc: torch.Tensor, n_valid: torch.Tensor,
                active: torch.Tensor, width) -> None:
        """Statistics of one forward, vectorised over the batch; width: query tokens each row fed ([B] or int)."""
        N, n, tally = self.N, self.n, self.tally
        slots = self.slots[:q.shape[1]]
        m = torch.where(active, torch.minimum(n_acc + 1, N - n), 0)  # [B] tokens committed this forward
        relaxed = torch.cat([v.relaxed, torch.zeros_like(v.relaxed[:, :1])], 1)  # [B, S]
        kind = torch.where(relaxed, COMMIT_RELAXED, COMMIT_ACCEPTED).to(torch.int8)
        tally.mark(n[:, None] + slots, kind, slots < n_acc[:, None])  # the accepted drafts
        last = torch.where(n_acc < n_valid, COMMIT_RESAMPLED, COMMIT_BONUS).to(torch.int8)  # [B]
        tally.mark((n + n_acc).clamp(max=N + self.K), last, n_acc < m)  # the token after them, if inside the image
        tally.ent_sum += (entropy(q) * (slots < m[:, None])).sum(1)
        tally.forward(m, active, width)
        tally.drafted += torch.where(active, torch.minimum(n_acc + 1, n_valid), 0)
        tally.accepted += n_acc
        tally.relaxed += (v.relaxed & active[:, None]).sum(1)

    def _advance(self, v: Verdict, q: torch.Tensor, jacobi: torch.Tensor, n_acc: torch.Tensor,
                 u_init: torch.Tensor, active: torch.Tensor) -> None:
        """Commit, and set up the next window: the Jacobi samples after the commit point carried over as drafts
        with their q as draft distribution, the rest fresh drafts up to the next window's end."""
        N, K, V, n, rows, offsets, buf = self.N, self.K, self.V, self.n, self.rows, self.offsets, self.buf
        S = q.shape[1]
        # accepted drafts are already in buf; write the resampled / bonus token
        pos_next = (n + n_acc).clamp(max=N + K)
        buf[rows, pos_next] = torch.where(active, v.next_token, buf[rows, pos_next])
        new_n = torch.where(active, (n + n_acc + 1).clamp(max=N), n)
        shift = n_acc + 1  # window slot j of the next window is slot j + shift of this q / jacobi
        src = (offsets[None, :] + shift[:, None]).clamp(max=S - 1)  # [B, K]
        carry_ok = (offsets[None, :] + shift[:, None]) < self.L[:, None]  # [B, K]: slots this forward fed
        carried = carry_ok.sum(1)  # [B]
        widx = new_n[:, None] + offsets  # [B, K] indices of the next drafts
        new_tok = torch.where(carry_ok, jacobi.gather(1, src), 0)
        buf[rows[:, None], widx] = torch.where(active[:, None], new_tok, buf[rows[:, None], widx])
        q_src = q.gather(1, src.unsqueeze(-1).expand(len(rows), K, V))  # [B, K, V]
        self.L = self.sizes.lengths(new_n, N)
        # drafts up to the next window's end; finished samples draft nothing (first = K)
        fresh_p = self.drafter.draft(buf, new_n, torch.where(active, carried, K), (self.L - 1).clamp(min=0), u_init)
        self.p = torch.where(active[:, None, None], torch.where(carry_ok[..., None], q_src, fresh_p), self.p)
        self.n = new_n

    # ---- continuous batching (slots.py's SlotLoop): a slot whose sample is done takes the next prompt

    @property
    def packs(self) -> bool:
        """Whether an admitted prompt's prefill rides in the step. Not in a tree step (branches): its entries are
        laid out per row at the window's slots and scratch slots after it, a caption's 36 entries would widen every
        row's tree to them, and gpt.tree_mask places entries from the row's first index, where a caption starts
        at position 0; such prefills run in a forward of their own (slots.stream)."""
        return self.branches is None

    def done(self) -> list[bool]:
        """[B] whether each slot's sample holds all its tokens (the loop's one host sync per forward)."""
        return (self.n >= self.N).tolist()

    def harvest(self, b: int) -> tuple[torch.Tensor, SampleStats]:
        """Slot b's finished sample: its tokens [N] and statistics."""
        return self.buf[b, :self.N].clone(), self.tally.stats(self.model.grid, 0.0, self.settings, rows=[b])[0]

    def idle_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, index [B, 1], lengths [B]) of a step in which no slot feeds anything: each row's padding at the
        index its next window starts at, which that window rewrites before any query reads it."""
        index = (self.n - 1)[:, None]
        return torch.zeros_like(index), index, torch.zeros_like(self.n)

    def admit(self, admit, pre: StepOutput) -> None:
        """Slots admit.rows start samples admit.seeds from their prefill's output pre [R, 1], every per-sample state
        as `start_window` makes it, so their tokens are a fixed batch's."""
        rows = admit.rows
        self.streams.admit(rows, admit.seeds)  # the coupled noise's base too (PositionNoise holds it)
        if self.noise is not None:
            self.noise.forget(rows)
        q0 = next_probs(pre, self.sc)  # [R, V]
        self.buf[rows] = 0
        self.buf[rows, 0] = sample_from(q0, self.streams.uniform(Purpose.TOKEN, 0)[rows])
        self.tally.reset(admit.at)
        self.tally.ent_sum[rows] += entropy(q0)
        self.drafter.restart(rows, pre)
        self.n[rows], self.t[rows] = 1, 0
        self.sizes.restart(rows)
        self.first_window(torch.zeros_like(self.n, dtype=torch.bool).index_fill_(0, rows, True))


MIN_WINDOW = 2  # the last committed token and one draft
GROW, SHRINK = 2, 1  # HF's heuristic schedule: +2 candidates after a fully accepted forward, -1 after a rejection


class WindowSizes:
    """The batch's windows [B] (fixed, or adaptive: module doc), updated after every forward from each sample's
    accepted drafts."""

    def __init__(self, batch: int, window: int, adaptive: bool, dev: torch.device):
        self.window, self.adaptive = window, adaptive
        # the windows each sample would feed, before the image's end: adaptive ones start at the full window
        self.want = torch.full((batch,), window, dtype=torch.long, device=dev)  # [B]

    def observe(self, n_accepted: torch.Tensor, judged: torch.Tensor, active: torch.Tensor) -> None:
        """This forward's accepted drafts [B] out of judged [B] per sample; finished samples keep their state."""
        if self.adaptive:
            step = torch.where(n_accepted >= judged, GROW, -SHRINK)
            self.want = torch.where(active, (self.want + step).clamp(MIN_WINDOW, self.window), self.want)

    def restart(self, rows: torch.Tensor) -> None:
        """Rows `rows` [R] took new samples: they start at the full window again."""
        self.want[rows] = self.window

    def lengths(self, n: torch.Tensor, N: int) -> torch.Tensor:
        """[B] tokens each sample feeds next, given its committed count n [B]: 0 once it has all N."""
        return torch.where(n < N, torch.minimum(self.want, N - n + 1), 0)


@dataclass
class Layout:
    """One forward's entries: the main windows [B, S] followed by each row's branches."""
    tokens: torch.Tensor  # [B, E] every entry's token
    index: torch.Tensor  # [B, E] its image index
    lengths: torch.Tensor  # [B] entries per row: L_b + C * D_b
    tree: torch.Tensor  # [B, E, E] which entries each entry sees
    cands: torch.Tensor  # [B, C] the first token of each branch
    D: torch.Tensor  # [B] entries per branch (0: the row has none)
    L: torch.Tensor  # [B] the main window's length


class Branches:
    """Proactive drafting (module doc): lays out each forward's branches and resolves them after the main window's
    verification."""

    def __init__(self, branches: int, branch_len: int, window: int):
        self.C = branches - 1  # side branches per row
        self.D_max = branch_tokens(branches, branch_len, window)

    def lay_out(self, tokens: torch.Tensor, idx: torch.Tensor, L: torch.Tensor, p: torch.Tensor) -> Layout:
        """tokens, idx [B, S] the main windows (slot 0: the last committed token); L [B] their lengths; p [B, K, V]
        the drafts' distributions (p[:, 0]: the first draft's)."""
        B, S = tokens.shape
        C, dev = self.C, tokens.device
        D = torch.where(L >= 2, torch.clamp(L - 1, max=self.D_max), 0)  # [B]
        p0 = p[:, 0].scatter(1, tokens[:, 1:2].clamp(min=0), -1.0)  # the main draft is not a candidate again
        cands = p0.topk(C, dim=1).indices  # [B, C]
        lengths = L + C * D
        E = max(int(lengths.max()), 1)
        e = torch.arange(E, device=dev)[None, :]  # [1, E]
        rel = e - L[:, None]  # [B, E] position within the branches
        Dc = D.clamp(min=1)[:, None]
        k, d = rel.div(Dc, rounding_mode="floor"), rel.remainder(Dc)  # [B, E] branch and depth of each entry
        side = (rel >= 0) & (k < C) & (D[:, None] > 0)
        main = e < L[:, None]
        rows = torch.arange(B, device=dev)[:, None]
        tok = torch.where(d == 0, cands.gather(1, k.clamp(0, C - 1)), tokens[rows, (d + 1).clamp(max=S - 1)])
        tok = torch.where(side, tok, tokens[rows, e.clamp(max=S - 1)])
        n0 = idx[:, :1]  # [B, 1] the last committed token's index
        index = torch.where(side, n0 + 1 + d, torch.where(main, n0 + e, n0))
        q_main, q_side = main[:, :, None], side[:, :, None]
        k_main, k_side = main[:, None, :], side[:, None, :]
        same = (k[:, :, None] == k[:, None, :]) & (d[:, None, :] <= d[:, :, None])  # [B, E, E]
        tree = (q_main & k_main & (e[:, None, :] <= e[:, :, None]))
        tree = tree | (q_side & k_side & same) | (q_side & (e == 0)[:, None, :])
        tree = tree | torch.eye(E, dtype=torch.bool, device=dev)[None]  # padding sees itself
        return Layout(torch.where(main | side, tok, 0), index, lengths, tree, cands, D, L)

    def step(self, model, lay: Layout, S: int) -> tuple[StepOutput, StepOutput]:
        """One forward over the layout -> (the main windows' output [B, S], the branches' [B, C, D_max])."""
        uniform = bool((lay.lengths == lay.lengths[0]).all())
        out = model.step(lay.tokens, lay.index, None if uniform else lay.lengths, tree=lay.tree)
        at = self._side_entries(lay)  # [B, C * D_max]

        def part(x: torch.Tensor | None, sel) -> torch.Tensor | None:
            return None if x is None else sel(x)

        def main(x):
            return x[:, :S]

        def side(x):
            return x.gather(1, at[..., None].expand(-1, -1, x.shape[-1])).view(len(at), self.C, self.D_max, -1)
        outs = [StepOutput(*(part(x, sel) for x in (out.cond, out.uncond, out.hidden, out.hidden_uncond)))
                for sel in (main, side)]
        return outs[0], outs[1]

    def _side_entries(self, lay: Layout) -> torch.Tensor:
        """[B, C * D_max] entry of (branch k, depth d), clamped to the row's last entry where d >= D_b."""
        k = torch.arange(self.C, device=lay.L.device)[:, None]
        d = torch.arange(self.D_max, device=lay.L.device)[None, :]
        at = lay.L[:, None, None] + k[None] * lay.D[:, None, None] + d[None]  # [B, C, D_max]
        return at.clamp(max=lay.tokens.shape[1] - 1).flatten(1)

    def resolve(self, lay: Layout, v: Verdict, q: torch.Tensor, q_side: torch.Tensor, tokens: torch.Tensor,
                p: torch.Tensor, n_valid: torch.Tensor, u_acc: torch.Tensor, u_res: torch.Tensor,
                u_branch: torch.Tensor, relax: Relaxation, active: torch.Tensor):
        """The main windows' verdict v, with the branches where the first draft was rejected -> (verdict, q [B, S, V]
        with a winning branch's distributions in place of the main window's, won [B]: the branch, -1 for none).
        q [B, S, V], q_side [B, C, D_max, V] processed; tokens [B, S] the main windows; p, n_valid, u_acc and u_res
        as verify took them; u_branch [B, C] one uniform per candidate."""
        B, S, V = q.shape
        need = active & (lay.D > 0) & (v.n_accepted == 0) & (n_valid >= 1)
        if S < 2 or not bool(need.any()):
            return v, q, torch.full_like(v.n_accepted, -1)
        won, r_last = verify_candidates(residual(q[:, 0].float(), p[:, 0].float()), lay.cands, u_branch)
        won = torch.where(need, won, -1)
        win, lost = won >= 0, need & (won < 0)
        rows = torch.arange(B, device=q.device)
        m = min(self.D_max, S - 1)
        q_eff = q.clone()
        qs = q_side[rows, won.clamp(min=0), :m]  # [B, m, V] the winning branch's distributions
        q_eff[:, 1:1 + m] = torch.where(win[:, None, None], qs.to(q.dtype), q[:, 1:1 + m])
        v2 = verify(tokens[:, 2:], p[:, 1:S - 1], q_eff[:, 1:], (lay.D - 1).clamp(min=0), u_acc[:, 1:], u_res, relax)
        first = torch.ones_like(v.accepted[:, :1])  # the winning candidate: accepted, by the standard rule
        w2 = win[:, None]
        n_acc = torch.where(win, 1 + v2.n_accepted, v.n_accepted)
        nxt = torch.where(win, v2.next_token, torch.where(lost, sample_from(r_last, u_res), v.next_token))
        out = Verdict(n_acc, nxt, torch.where(w2, torch.cat([first, v2.accepted], 1), v.accepted),
                      torch.where(w2, torch.cat([~first, v2.relaxed], 1), v.relaxed), v.tv)
        return out, q_eff, won

    def commit(self, lay: Layout, won: torch.Tensor, n_acc: torch.Tensor, side: StepOutput, model, drafter,
               buf: torch.Tensor) -> None:
        """A winning branch's first token into buf, its accepted keys and values to their positions, and its
        hidden states to the drafter (the heads draft from them)."""
        win = won >= 0
        if not bool(win.any()):
            return
        B, dev = len(won), won.device
        rows = torch.arange(B, device=dev)
        n = lay.index[:, 0] + 1  # [B] the first draft's index
        buf[rows, n] = torch.where(win, lay.cands[rows, won.clamp(min=0)], buf[rows, n])
        d = torch.arange(self.D_max, device=dev)[None, :]  # [1, D_max]
        src = (n - 1 + lay.L + won.clamp(min=0) * lay.D)[:, None] + d  # [B, D_max] the branch's scratch slots
        model.copy_cache(src, n[:, None] + d, win[:, None] & (d < n_acc[:, None]))
        k = won.clamp(min=0)
        hid = StepOutput(side.cond[rows, k], None if side.uncond is None else side.uncond[rows, k],
                         side.hidden[rows, k], None if side.hidden_uncond is None else side.hidden_uncond[rows, k])
        drafter.observe(hid, n[:, None] + d, win[:, None] & (d < lay.D[:, None]))
