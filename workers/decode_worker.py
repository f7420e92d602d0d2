"""The Ray actor that decodes: it loads the model and builds its one `Decoder` once, then decodes batches.

Ray Data's callable-class pattern: `__init__` does the expensive load, `__call__` does the work. It is a plain
class; the flow wraps it with `ray.remote(...).options(num_cpus=, num_gpus=, max_restarts=-1)`, so a crashed
actor is restarted (and reloads) by Ray. The decoder is decided before the pool exists (flows.pipeline resolves
a calibrated spec first, in a short-lived actor's `calibrate`) and given to the constructor, which Ray replays on
a restart: every incarnation decodes by the same resolved spec, and no spec travels with a batch. Each result
says which decoder made it (`str(decoder)`) and whether it fell back to AR, so the commit records what ran.

The actor does no storage I/O: it takes prompt rows
and returns encoded image bytes (PNG, WebP or JPEG: formats/images.py), token grids and statistics, so the flow
that owns the output layout decides what is committed.

Per-sample failures never fail the batch: a row that arrives with an error, a prompt the model rejects, or a
sample whose decoding raises becomes an error row. The batch is decoded together (one decoder call) when it
can be; only if that call raises are the samples retried one by one to isolate the culprit.

Rows the flow marked for the fidelity audit (`audit_seed`, see output/audit.py) are also scored under the
target and decoded again with `ar`, after the batch and on their own clock, so the audit is costed apart.
"""

from __future__ import annotations

import os
import time
import numpy as np

from ssdgen.decoders.spec import DecodeSpec
from ssdgen.formats.images import encode_image

from .cpus import ThreadGovernor, ThreadPolicy
from .results import BAD_INPUT, DECODE_FAILED, BatchResult, Sample
from .settings import WorkerSettings


MEMORY_SHARE = 0.5  # of the memory free when an actor plans, what its batch's caches may take (the rest: the
# activations, the images, the other processes)


def batch_choices(model, use_cfg: bool, most: int, sharing: int = 1) -> list[int]:
    """The batch sizes a plan may choose among (planner.BATCHES): at most `most`, and those whose caches fit in
    MEMORY_SHARE of the device's free memory split among `sharing` actors (the model's own count of its cache
    bytes per sample, `capabilities.kv_bytes_per_sample`; a model that does not say is capped by `most` only)."""
    from ssdgen.decoders.planner import BATCHES
    per_sample = model.capabilities.kv_bytes_per_sample
    cap = most
    if per_sample is not None:
        cap = min(cap, int(MEMORY_SHARE * free_memory(model) / max(1, sharing) // per_sample(use_cfg)))
    return [b for b in BATCHES if b <= cap] or [1]


def free_memory(model) -> int:
    """Bytes free on the model's device now: the GPU's (torch.cuda.mem_get_info), else the machine's RAM."""
    import torch
    dev = torch.device(getattr(model, "device", "cpu"))
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    import psutil
    return psutil.virtual_memory().available


class DecodeWorker:
    def __init__(self, settings: WorkerSettings, threads: ThreadPolicy | int = 1, resolved: DecodeSpec | None = None):
        """settings: the run's worker part (RunSettings.worker()), its `decoder` the requested spec; threads: torch
        intra-op threads, as the driver read them (ThreadPolicy.from_env: on a CPU, actors x threads should match
        the cores; an int is a fixed count), given up to other processes' load while decoding (workers/cpus.py);
        resolved: the concrete spec a calibrated request resolved to (the run's plan), None for a spec that needs
        no plan or an actor that only calibrates."""
        import torch
        t0 = time.perf_counter()
        policy = threads if isinstance(threads, ThreadPolicy) else ThreadPolicy(cap=threads, adapt=False)
        self.spec, self.governor = settings, ThreadGovernor(policy)
        self.threads = self.governor.cap
        self.device = "cpu"
        try:
            import ray
            if ray.is_initialized() and ray.get_gpu_ids() and torch.cuda.is_available():
                self.device = "cuda"  # Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned this actor
        except ImportError:
            pass
        from ssdgen.decoders.decoder import build
        from ssdgen.models.registry import load_model
        self.model = load_model(self.spec.model, device=self.device, dtype=self.spec.dtype)
        # built once, its heads loaded and held here for every batch (nothing is kept on the model object); the
        # request stays known to it, so a plan that chose AR is said in every sample's statistics
        decoder = build(self.spec.decoder, self.model)
        self.decoder = decoder if resolved is None else decoder.as_spec(resolved)
        self.sc = self.spec.decoder.sampling
        self.load_s = time.perf_counter() - t0
        self.reported_load = False
        self.where = {"pid": os.getpid(), "node_id": _node_id(), "device": self.device}

    def info(self) -> dict:
        return {"pid": os.getpid(), "node_id": _node_id(), "device": self.device, "load_s": self.load_s,
                "model": self.model.name, "threads": self.threads}

    def take_load_seconds(self) -> float:
        """This incarnation's model-load (and calibration) time, reported once (so it is charged to exactly one
        shard)."""
        if self.reported_load:
            return 0.0
        self.reported_load = True
        return self.load_s

    def _sync(self):
        if self.device == "cuda":
            import torch
            torch.cuda.synchronize()

    def _decode(self, prompts: list[str], seeds: list[int]):
        with self.governor.watching(self.model):
            res = self.decoder.decode(prompts, seeds)  # a fall-back to AR is said in its statistics (decoder.py)
        images = self.model.decode_images(res.tokens).numpy()
        return res.tokens.cpu().numpy(), images, res.stats

    def calibrate(self, rows: list[dict], batch: int | None, objective: str = "throughput", most: int = 256,
                  sharing: int = 1) -> dict:
        """A calibrated spec resolved for the objective on this actor's device, planned on the rows' prompts
        (decoders/planner.py) -> {"spec": the concrete spec's text, "measurements": the plan, its batch included};
        the flow records it and builds its actors with that spec. batch: the user's batch size, or None for the
        planner to choose one (`batch_choices`: at most `most`, a shard's rows, and what memory holds with
        `sharing` actors on the machine). The device profile comes from the cache when this device measured it
        before (workers/plan_cache.py). Its time is a one-time cost like the model load, and is charged with it
        (`take_load_seconds`)."""
        from ssdgen.workers import plan_cache
        t0 = time.perf_counter()
        good = [r for r in rows if not r.get("error") and self._valid(r["prompt"])]
        if not good:
            raise ValueError(f"no valid prompt among the first {len(rows)} rows to calibrate "
                             f"{self.decoder.spec.label} on; put valid prompts first, or set calibrated=false")
        batches = batch or batch_choices(self.model, self.sc.uses_cfg, most, sharing)
        key = plan_cache.key(self.model, self.decoder.spec, batches, threads=self.threads)
        reduced = self.governor.reduced_s
        with self.governor.watching(self.model):
            chosen = self.decoder.resolve([r["prompt"] for r in good], [int(r["seed"]) for r in good], batches,
                                          objective, plan_cache.load(key))
        # a profile measured with threads given up to a neighbour is not this machine's: used, never cached
        if not chosen.plan.cached and self.governor.reduced_s == reduced and self.governor.threads == self.threads:
            plan_cache.save(key, chosen.plan)
        self.load_s += time.perf_counter() - t0
        return {"spec": str(chosen), "measurements": chosen.plan.to_dict()}

    def _valid(self, prompt: str) -> bool:
        try:
            self.model.validate_prompts([prompt])
            return True
        except ValueError:  # an error row later, when its shard decodes
            return False

    def __call__(self, rows: list[dict]) -> BatchResult:
        """rows: [{prompt_id, prompt, seed, error[, audit_seed]}] -> a BatchResult (workers/results.py): the samples
        keyed by prompt_id; the decoder that made them and whether it fell back; busy_s leaves out the audit (see
        `_audit`); load_s is this incarnation's model load on its first batch, else 0, and `worker` says where it
        ran: the flow needs no extra call per shard to learn any of them."""
        from ssdgen.decoders.protocol import prompt_error_reason
        t0 = time.perf_counter()
        out: dict[str, Sample] = {}
        good = []
        for r in rows:
            if r.get("error"):
                out[r["prompt_id"]] = Sample.failed(r["prompt_id"], r["error"], BAD_INPUT)
                continue
            try:
                self.model.validate_prompts([r["prompt"]])
                good.append(r)
            except ValueError as e:  # PromptError and friends: a bad prompt, not a bad batch
                out[r["prompt_id"]] = Sample.failed(r["prompt_id"],
                                                    f"invalid prompt: {str(e).removeprefix('prompt 0: ')}",
                                                    prompt_error_reason(e))
        try:
            if good:
                self._decode_group(good, out)
        except Exception:  # noqa: BLE001 - isolate the failing sample(s) by decoding one at a time
            for r in good:
                out.pop(r["prompt_id"], None)
                try:
                    self._decode_group([r], out)
                except Exception as e:  # noqa: BLE001
                    out[r["prompt_id"]] = Sample.failed(r["prompt_id"], f"decoding failed: {type(e).__name__}: {e}",
                                                        DECODE_FAILED)
        self._sync()
        busy = time.perf_counter() - t0  # the audit below is not the images' work: it is timed on its own
        audit, audit_s = self._audit(rows, out)
        return BatchResult({r["prompt_id"]: out[r["prompt_id"]] for r in rows}, str(self.decoder),
                           self.decoder.falls_back, busy, audit, audit_s, self.take_load_seconds(), self.where)

    def _audit(self, rows: list[dict], out: dict[str, Sample]) -> tuple[list[dict], float]:
        """Audit the decoded rows the flow marked with an `audit_seed` (output.audit): the target's NLL per token
        of the tokens just decoded, and of an `ar` sample of the same prompts from the audit seed. Returns the
        audit rows (without the decoder label, which the flow adds) and the audit's seconds."""
        todo = [r for r in rows if r.get("audit_seed") is not None and out[r["prompt_id"]].ok]
        if not todo:
            return [], 0.0
        import torch
        from ssdgen.decoders import decode
        from ssdgen.decoders.fidelity import target_nll
        t0 = time.perf_counter()
        prompts = [r["prompt"] for r in todo]
        tokens = torch.tensor([out[r["prompt_id"]].tokens for r in todo], dtype=torch.long)
        nll = target_nll(self.model, prompts, tokens, self.sc)
        ar = decode("ar", self.model, prompts, [int(r["audit_seed"]) for r in todo], self.sc)
        ar_nll = target_nll(self.model, prompts, ar.tokens, self.sc)
        self._sync()
        per = (time.perf_counter() - t0) / len(todo)
        return [{"prompt_id": r["prompt_id"], "seed": int(r["seed"]), "nll_per_token": float(nll[i]),
                 "ar_seed": int(r["audit_seed"]), "ar_nll_per_token": float(ar_nll[i]),
                 "forwards": out[r["prompt_id"]].stats["forwards"], "ar_forwards": ar.stats[i].forwards,
                 "audit_seconds": per} for i, r in enumerate(todo)], per * len(todo)

    def _decode_group(self, group: list[dict], out: dict[str, Sample]) -> None:
        t0 = time.perf_counter()
        tokens, images, stats = self._decode([r["prompt"] for r in group], [int(r["seed"]) for r in group])
        self._sync()
        per = (time.perf_counter() - t0) / len(group)
        for r, tok, img, st in zip(group, tokens, images, stats):
            out[r["prompt_id"]] = Sample(
                r["prompt_id"], "ok", image=encode_image(img, self.spec.image_format, self.spec.quality),
                width=int(img.shape[1]), height=int(img.shape[0]), tokens=tok.astype(np.int32).tolist(),
                grid=tuple(st.commit_map.shape), stats=st.to_row(), latency_s=per)


def _node_id() -> str | None:
    """The Ray node this actor runs on (None outside Ray): markers record it, so a cluster run shows which node
    made each shard."""
    try:
        import ray
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except ImportError:
        return None
