"""End to end on a tiny Janus checkpoint folder laid out as a user has it (safetensors weights, config.json,
generation_config.json naming the BOI and PAD ids, a tokenizer): `ssdgen train-heads --model janus:DIR`, then
the generate flow with `ssd+csd` and those heads, from prompts on the moto S3 server to committed images and
statistics on it; and `ssdgen sample` with the same heads. In fp32 and with the model in bf16 (the issue's
`mat1 and mat2 must have the same dtype` in train-heads). Slow: CLI subprocesses, Prefect and Ray."""

import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline_helpers import committed_tables, run_flow, write_parquet  # noqa: E402
from test_hf_adapters import N_TEXT, tiny_janus  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "local_ray")]

PROMPTS = ["a red circle on gray", "a small blue square at the top left", "green triangle",
           "a dotted yellow diamond on a striped brown background"]


def _tokenizer():
    """A word-level fast tokenizer over the tiny model's text ids 3 .. N_TEXT - 1 (0 pad, 1 bos, 2 eos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = sorted({w for p in PROMPTS for w in p.split()})
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {w: 4 + i for i, w in enumerate(words)}
    assert max(vocab.values()) < N_TEXT
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def janus_folder(path):
    """What a user downloads: weights as safetensors, the configs and a tokenizer."""
    from transformers import GenerationConfig
    torch.manual_seed(0)
    a = tiny_janus()
    a.model.save_pretrained(path)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=a.pad_id,
                     generation_kwargs={"boi_token_id": a.boi_id}).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    assert any(f.suffix == ".safetensors" for f in path.iterdir())
    return path


def cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_train_heads_then_generate_ssd_csd_on_s3(s3, tmp_path, dtype):
    ckpt = janus_folder(tmp_path / "janus")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    heads = tmp_path / "heads" / "janus"
    model = f"janus:{ckpt}"
    cli("train-heads", "--model", model, "--prompts", str(prompts), "--out", str(heads), "--n-images", "4",
        "--steps", "5", "--dtype", dtype)
    assert heads.with_suffix(".safetensors").exists() and heads.with_suffix(".json").exists()
    decoder = f"ssd+csd:heads={heads}:calibrated=false"
    grid = tmp_path / "grid.png"
    cli("sample", "--model", model, "--prompt", PROMPTS[0], "--n", "2", "--out", str(grid), "--decoder", decoder,
        "--dtype", dtype)
    assert grid.exists()
    write_parquet(s3, "ssdgen-test/in/p.parquet", [{"prompt_id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)])
    out = f"s3://ssdgen-test/run-{dtype}"
    summary = run_flow(prompts=["s3://ssdgen-test/in/"], out=out, model=model, decoder=decoder, actors=1,
                       batch_size=4, shard_size=4)
    assert summary["images_ok"] == 4 and summary["images_failed"] == 0
    images, stats = committed_tables(out)
    assert images.num_rows == 4 and stats.num_rows == 4
    assert all(r["bytes"] for r in images.column("image").to_pylist())
    assert all(f >= 1 for f in stats.column("forwards").to_pylist())
