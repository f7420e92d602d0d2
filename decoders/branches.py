"""Proactive drafting (SJD-PAC): more candidates for the window's first draft, verified in the same forward by tree
attention, for the window loop (window.py; `branches=K`).

Why: after a rejection the window's first draft (index n, right after the resampled token) was drafted from a
context that held the rejected token, and it is accepted about half the time (48% for lossless ssd on the bundled
model); when it is rejected the forward commits one token, when it is accepted the drafts behind it are usually
accepted for a long run. So the window gets K - 1 side branches that differ from it in that one token only:

    main      [y, x_n, x_n+1, ..., x_n+L-2]       y: the last committed token, x: the window's drafts
    branch k  [   c_k, x_n+1, ..., x_n+D-1]       c_k: the k-th most likely token of x_n's draft distribution
                                                  other than x_n; the rest are the main window's own drafts

Each branch attends to the committed prefix, y and its own earlier entries (gpt.tree_mask): a tree whose root y
has K children, each continuing as a chain of D entries (D = `branch_len`, at most the window's drafts). One forward
computes them all; the model caches a branch's keys at scratch slots after the window.

Verification stays exact. The main window is verified as without branches. If its first draft is rejected, the
candidates c_1 .. c_{K-1} are tested in turn against the residual it left (verify.verify_candidates: SpecInfer's
recursive rejection sampling with deterministic drafts), and the first accepted one wins; its branch's drafts are
then verified against its own distributions by the standard rule, and its accepted keys and values are copied to
their positions (model.copy_cache). If none is accepted, the token is drawn from the last residual. The candidates
are fixed before the forward and every test uses a uniform no other test uses, so each committed token is a sample
from the target given the tokens before it (the exact-distribution test, tests/test_branches.py, checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .recipes import Relaxation, branch_tokens
from .protocol import StepOutput
from .sampling import sample_from
from .verify import Verdict, residual, verify, verify_candidates


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
    """Lays out each forward's branches and resolves them after the main window's verification."""

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
