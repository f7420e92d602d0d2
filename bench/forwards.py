"""Counting the model calls a decoder makes, for `ssdgen bench` (bench/decode.py: a row's forwards per batch,
rows and tokens per forward) and the shape replay (lab/bench/shape_replay.py: the forward shapes it traced)."""

from __future__ import annotations


class ForwardCounter:
    """Counts the model calls a decoder makes: prefills (`start`) and forwards (`step`), with the rows fed
    (CFG's doubled batch included) and the query tokens per row. Wraps the instance's methods while active.

    While `recording`, each call is also appended to `trace` as [rows, tokens per row, context length]: the
    forward shapes a decoder produced, which lab/bench/shape_replay.py replays on bigger models."""

    def __init__(self, model):
        self.model = model
        self.prefills = self.prefill_tokens = self.steps = self.step_rows = self.step_tokens = 0
        self.recording, self.trace = False, []

    def __enter__(self):
        m = self.model
        self._saved = {k: m.__dict__[k] for k in ("start", "step") if k in m.__dict__}
        start, step = m.start, m.step

        def counted_start(prompts, use_cfg):
            out = start(prompts, use_cfg)
            self.prefills += 1
            rows = len(prompts) * (2 if use_cfg else 1)
            self.prefill_tokens += rows * _prompt_len(m)
            self._cfg_factor = 2 if use_cfg else 1
            if self.recording:
                self.trace.append([rows, _prompt_len(m), _prompt_len(m)])
            return out

        def counted_step(tokens, index, lengths=None, **kw):  # kw: tree= (decoders/window.py: Branches)
            self.steps += 1
            f = getattr(self, "_cfg_factor", 1)
            self.step_rows += tokens.shape[0] * f
            # a packed step computes each row's own entries only
            self.step_tokens += (tokens.numel() if lengths is None else int(lengths.sum())) * f
            if self.recording:  # the furthest position fed bounds the attention's width; the padded width
                # a tree step caches entry s at slot index[:, 0] + s (reference/gpt.py tree_mask), past its positions
                end = int(index[:, 0].max()) + tokens.shape[1] if kw.get("tree") is not None else int(index.max()) + 1
                self.trace.append([tokens.shape[0] * f, tokens.shape[1], _prompt_len(m) + end])
            return step(tokens, index, lengths, **kw)

        m.start, m.step = counted_start, counted_step
        return self

    def __exit__(self, *exc):
        m = self.model
        for k in ("start", "step"):
            if k in self._saved:
                setattr(m, k, self._saved[k])
            else:
                m.__dict__.pop(k, None)
        return False


def _prompt_len(model) -> int:
    g = getattr(getattr(model, "gpt", None), "cfg", None)
    return int(getattr(g, "caption_len", 0) or 0)
