"""Model precision (--dtype): which dtype a name resolves to on a device, fp16 on the CPU refused in one line,
every decoder and the heads' training on a bf16 model (the issue's `mat1 and mat2 must have the same dtype`
in train-heads on a bf16 Hugging Face checkpoint), and the processed distribution in fp32 whatever the
model's dtype."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from ssdgen.decoders import decode  # noqa: E402
from ssdgen.decoders.recipes import SamplingConfig
from ssdgen.decoders.sampling import processed_probs  # noqa: E402
from ssdgen.decoders.ssd_train import DistillConfig, draft_acceptance, train_heads  # noqa: E402
from ssdgen.models.registry import load_model, resolve_dtype  # noqa: E402
from test_decoders import PROMPTS  # noqa: E402
from tiny import tiny_with_heads  # noqa: E402

SAMPLED = SamplingConfig(cfg_scale=3.0)
FILTERED = SamplingConfig(cfg_scale=2.0, temperature=0.9, top_k=5, top_p=0.9)
QUIET = {"log": lambda *a: None}


@pytest.mark.parametrize("name, device, hf, want", [
    ("auto", "cpu", False, torch.float32), ("auto", "cpu", True, torch.float32),
    ("auto", "cuda", True, torch.bfloat16), ("auto", "cuda", False, torch.float32),
    ("bf16", "cpu", False, torch.bfloat16), ("fp32", "cuda:1", True, torch.float32),
    ("fp16", "cuda", False, torch.float16),
])
def test_dtype_names_resolve_per_device(name, device, hf, want):
    assert resolve_dtype(name, device, hf) == want


def test_fp16_on_the_cpu_and_unknown_names_are_refused_in_one_line():
    with pytest.raises(ValueError, match="fp16 is not supported on the CPU") as e:
        resolve_dtype("fp16", "cpu")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="--dtype must be one of auto, fp32, bf16, fp16"):
        resolve_dtype("fp64", "cpu")


def test_the_flow_checks_records_and_hands_its_dtype_to_the_actors():
    from ssdgen.inputs.files import InputFile
    from ssdgen.flows.pipeline import RunSettings
    with pytest.raises(ValueError, match="fp16 is not supported on the CPU"):
        RunSettings(prompts=("x",), dtype="fp16").check()
    RunSettings(prompts=("x",), dtype="fp16", gpus_per_actor=1, device_type="l4").check()
    files = [InputFile("file:///x.parquet", 3, (3,), 100, True, False)]
    base = RunSettings(prompts=("x",)).recorded(files)
    assert base["dtype"] == "auto"  # recorded at its default too
    bf = RunSettings(prompts=("x",), dtype="bf16")
    assert bf.recorded(files) == base | {"dtype": "bf16"} and bf.worker().dtype == "bf16"


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "t"
    tiny_with_heads(path)
    return load_model(f"reference:{path}", dtype="bf16")


def test_the_loader_puts_the_transformer_in_the_dtype_and_keeps_the_vq_fp32(bf16):
    assert bf16.dtype == torch.bfloat16 and next(bf16.gpt.parameters()).dtype == torch.bfloat16
    assert next(bf16.vq.parameters()).dtype == torch.float32


def test_the_processed_distribution_is_fp32_for_bf16_logits():
    logits = torch.randn(2, 3, 16).to(torch.bfloat16)
    for sc in (SAMPLED, FILTERED, SamplingConfig(temperature=0)):
        q = processed_probs(logits, logits.flip(-1), sc)
        assert q.dtype == torch.float32 and torch.allclose(q.sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize("name, params", [
    ("ar", {}), ("sjd", {"window": 6, "coupled": True}), ("csd", {"window": 6}),
    ("ssd", {"rows": 2, "rounds": 1, "commit": "block"}), ("ssd", {"rows": 2}), ("ssd", {"lossless": True, "rows": 2}),
    ("ssd+csd", {"calibrated": False}),
])
def test_every_decoder_runs_on_a_bf16_model_and_verifies_in_fp32(bf16, monkeypatch, name, params):
    from ssdgen.decoders import block as block_mod
    from ssdgen.decoders import window as window_mod
    seen = []

    def spy(real):
        def wrapped(draft, p, q, *args, **kwargs):
            seen.append((p.dtype, q.dtype))
            return real(draft, p, q, *args, **kwargs)
        return wrapped
    monkeypatch.setattr(window_mod, "verify", spy(window_mod.verify))
    monkeypatch.setattr(block_mod, "verify_all", spy(block_mod.verify_all))
    res = decode(name, bf16, PROMPTS, [0, 1, 2, 3], FILTERED, params)
    assert res.tokens.shape == (4, 16) and int(res.tokens.max()) < bf16.n_codes
    assert set(seen) <= {(torch.float32, torch.float32)} and (name == "ar" or seen)


@pytest.mark.parametrize("kind", ["latent", "token"])
def test_heads_train_in_fp32_on_a_bf16_model(bf16, kind):
    heads, info = train_heads(bf16, PROMPTS, SAMPLED, DistillConfig(n_images=4, sample_batch=2, steps=3, batch=32,
                                                                    kind=kind), **QUIET)
    assert {p.dtype for p in heads.parameters()} == {torch.float32}
    assert all(torch.isfinite(p).all() for p in heads.parameters())
    acc = draft_acceptance(bf16, heads, PROMPTS[:2], [0, 1], SAMPLED)
    assert 0 < acc["horizontal"] <= 1 and 0 < acc["vertical"] <= 1


def test_heads_train_and_draft_on_a_bf16_hugging_face_model():
    """The issue's bug: train-heads on a bf16 Janus checkpoint failed with `mat1 and mat2 must have the same
    dtype, but got BFloat16 and Float`."""
    from test_hf_adapters import PROMPTS as HF_PROMPTS, tiny_janus
    torch.manual_seed(0)
    a = tiny_janus()
    a.model.to(torch.bfloat16)
    assert a.dtype == torch.bfloat16
    heads, _ = train_heads(a, HF_PROMPTS, SAMPLED, DistillConfig(n_images=4, sample_batch=2, steps=2, batch=16),
                           **QUIET)
    for params in ({"rows": 1, "rounds": 1, "commit": "block"}, {"rows": 1, "lossless": True}):
        res = decode("ssd", a, HF_PROMPTS[:2], [0, 1], SAMPLED, params, heads=heads)
        assert res.tokens.shape == (2, 16) and int(res.tokens.max()) < a.n_codes
