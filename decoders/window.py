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
Randomness is counter-based (rng.py): a forward's uniforms are keyed by the sample's seed and its own forward
number (which its own progress sets), and the coupled noise by its seed and the image index, so a sample's
tokens do not depend on its batch-mates, and the whole batch's numbers come from one set of tensor ops.
"""

from __future__ import annotations

import time

import torch

from . import rng
from .ar import prefill
from .branches import Branches
from .recipes import SamplingConfig, WindowConfig
from .drafters import DRAFTERS, Drafter
from .protocol import ImageTokenModel, check_request
from .sampling import gumbel_sample, model_device, processed_probs, sample_from
from .stats import DecodeResult, Tally
from .sample_stats import COMMIT_ACCEPTED, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED
from .verify import Verdict, entropy, verify, verify_all
from .window_sizes import WindowSizes


@torch.no_grad()
def decode_window(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
                  cfg: WindowConfig = WindowConfig(), heads=None) -> DecodeResult:
    """Decode by the window loop as `cfg` configures it (module doc): a window of cfg.tokens(W) tokens, drafted
    by cfg.drafter (drafters.DRAFTERS; heads: SSD's, for the heads drafter) and accepted by cfg.relax."""
    check_request(model, prompts, seeds, sc.greedy, cfg.relax.active)
    t0 = time.perf_counter()
    dev = model_device(model)  # every buffer and key below lives on it
    streams = rng.Streams(seeds, dev)
    N, L = model.grid[0] * model.grid[1], cfg.tokens(model.grid[1])
    drafter = DRAFTERS[cfg.drafter](model, sc, cfg, heads, len(prompts), N + L + 2)
    if cfg.branches > 1 and not model.capabilities.tree_attention:
        raise ValueError(f"branches={cfg.branches} verifies its candidates by tree attention, which model "
                         f"{model.name!r} does not have (the reference model does): set branches=1")
    jac = _Jacobi(model, sc, cfg, L, drafter, streams, dev)
    out, jac.buf[:, 0] = prefill(model, prompts, sc, streams, jac.tally)
    drafter.begin(out)
    jac.first_window()
    while (jac.n < jac.N).any():
        jac.forward()
    extra = {"window": L, "init": drafter.name, "coupled": cfg.coupled, "lam": cfg.relax.lam,
             "delta": cfg.relax.delta, "window_sizes": "adaptive" if cfg.adaptive else "fixed",
             "packed": cfg.packed} | ({"branches": cfg.branches, "branch_len": jac.branches.D_max}
                                      if jac.branches else {})
    if cfg.drafter == "heads":
        extra |= {"rows": cfg.rows, "lossless": not cfg.relax.active, "commit": "prefix", "two_d": cfg.two_d}
    stats = jac.tally.stats(model.grid, (time.perf_counter() - t0) / len(prompts), extra)
    return DecodeResult(jac.buf[:, :jac.N].clone(), stats)


class _Jacobi:
    """The batch's state between forwards: committed tokens and current drafts, the drafts' distributions and
    each sample's committed count; `forward` runs one iteration of the module doc's steps 1-4."""

    def __init__(self, model: ImageTokenModel, sc: SamplingConfig, cfg: WindowConfig, L: int, drafter: Drafter,
                 streams: rng.Streams, dev: torch.device):
        B, (H, W) = len(streams.key), model.grid
        self.model, self.sc, self.relax, self.drafter, self.streams = model, sc, cfg.relax, drafter, streams
        self.N, self.K, self.V = H * W, L - 1, model.n_codes
        N, K = self.N, self.K
        self.rows = torch.arange(B, device=dev)
        self.slots = torch.arange(K + 1, device=dev)  # window slots 0 .. K
        self.offsets = self.slots[:K]  # draft slots 0 .. K - 1
        self.noise = rng.PositionNoise(streams.base(rng.Purpose.NOISE), self.V, span=K + 1) if cfg.coupled else None
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

    def first_window(self) -> None:
        """Fresh drafts for the first window, after the prefill's token 0."""
        n, K = self.n, self.K
        u_init = self.streams.uniform(rng.Purpose.SJD_FIRST, 0, width=K)  # [B, K]
        self.L = self.sizes.lengths(n, self.N)
        self.p = self.drafter.draft(self.buf, n, torch.zeros_like(n), (self.L - 1).clamp(min=0), u_init)

    def _feed(self) -> tuple[int, torch.Tensor | None]:
        """(slots fed per row S, the model's lengths): the packed step feeds each sample its own window L_b,
        padded to the batch's widest (None when every row is that wide); the padded one the whole window."""
        if not self.packed:
            return self.K + 1, None
        lo, hi = torch.stack([self.L.min(), self.L.max()]).tolist()  # the loop's one host sync per forward
        return max(hi, 1), (None if lo == hi else self.L)

    def forward(self) -> None:
        N, n, rows, L = self.N, self.n, self.rows, self.L
        S, lengths = self._feed()
        K = S - 1  # drafts fed this forward (the config's K when padded)
        active = n < N
        idx = (n - 1)[:, None] + self.slots[:S]  # [B, S] window indices, may run past N
        tokens = self.buf[rows[:, None], idx]  # [B, S]
        lay = side = None
        if self.branches is None:
            out = self.model.step(tokens, idx, lengths)
        else:  # the main windows and their side branches in one forward (branches.py)
            lay = self.branches.lay_out(tokens, idx, L, self.p)
            out, side = self.branches.step(self.model, lay, S)
        fed = self.slots[:S][None, :] < L[:, None]  # [B, S] a sample's own window; the rest is padding
        self.drafter.observe(out, idx, fed)
        q = processed_probs(out.cond, out.uncond, self.sc)  # [B, S, V]
        # keyed by (seed, the sample's forward number): accept K, resample 1, Jacobi K+1, init K (config's K)
        Kc = self.K
        u = self.streams.uniform(rng.Purpose.SJD_STEP, self.t, width=3 * Kc + 2)  # [B, 3K+2]
        u_acc, u_res, u_jac, u_init = u[:, :K], u[:, Kc], u[:, Kc + 1:Kc + 1 + S], u[:, 2 * Kc + 2:]
        n_valid = (L - 1).clamp(min=0)  # [B] drafts judged: the sample's window, which stops at the image's end
        v = verify(tokens[:, 1:], self.p[:, :K], q, n_valid, u_acc, u_res, self.relax)
        if lay is not None:
            u_br = self.streams.uniform(rng.Purpose.BRANCH, self.t, width=self.branches.C)  # [B, C]
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
