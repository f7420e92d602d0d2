"""End to end on tiny Janus and Emu3 checkpoint folders laid out as a user has them (safetensors weights,
config.json, generation_config.json, a tokenizer; Janus's generation config names the BOI and PAD ids, Emu3's
config.json its image_area, hence its grid): `ssdgen train-heads --model KIND:DIR`, then the generate flow with
`ssd+csd` and those heads, from prompts on the moto S3 server to committed images and statistics on it; and
`ssdgen sample` with the same heads. In fp32 and with the model in bf16 (the issue's `mat1 and mat2 must have
the same dtype` in train-heads). Slow: CLI subprocesses, Prefect and Ray."""

import io
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from pipeline_helpers import committed_tables, run_flow, write_parquet  # noqa: E402
from test_hf_adapters import N_TEXT, tiny_emu3, tiny_janus  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "local_ray")]

PROMPTS = ["a red circle on gray", "a small blue square at the top left", "green triangle",
           "a dotted yellow diamond on a striped brown background"]
EMU3_AREA, EMU3_GRID = 64, (4, 4)  # 8 x 8 pixels at the tiny VQ's 2 x 2 pixels per token


def _tokenizer(extra_words=(), specials=None):
    """A word-level fast tokenizer over the tiny model's text ids 3 .. N_TEXT - 1 (0 pad, 1 bos, 2 eos), the
    prompts' words and `extra_words`; `specials` (token -> id) are added as special tokens at those ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = sorted({w for p in PROMPTS for w in p.split()} | set(extra_words))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {w: 4 + i for i, w in enumerate(words)}
    assert max(vocab.values()) < N_TEXT
    specials = specials or {}
    tok = Tokenizer(models.WordLevel(vocab | specials, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", additional_special_tokens=list(specials))


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


def emu3_folder(path):
    """An Emu3 checkpoint as a user has it: config.json with the vocabulary map and `image_area` (the
    original Emu3 checkpoints' key: the image size it generates, hence the grid), safetensors weights, a
    generation config and a tokenizer holding the prompt words, the digits and '*' of the "H*W" size prompt,
    and every special string of the vocabulary map (visual tokens, <|image start|>, <|extra_200|>, ...)."""
    from transformers import GenerationConfig
    torch.manual_seed(0)
    model = tiny_emu3().model
    model.config.image_area = EMU3_AREA  # saved into config.json, as Emu3-Gen's 518400 (720 x 720)
    model.save_pretrained(path)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(path)
    specials = {k: v for k, v in model.config.vocabulary_map.items() if v >= N_TEXT}
    tok = _tokenizer(list("0123456789*"), specials)
    assert tok.encode("<|image start|>4*4<|image token|>", add_special_tokens=False)[0] == \
        specials["<|image start|>"]
    assert tok.convert_tokens_to_ids("<|visual token000003|>") == specials["<|visual token000003|>"]
    tok.save_pretrained(path)
    assert any(f.suffix == ".safetensors" for f in path.iterdir())
    return path


FOLDERS = {"janus": janus_folder, "emu3": emu3_folder}


def cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(FOLDERS))
def test_train_heads_then_generate_ssd_csd_on_s3(s3, tmp_path, kind, dtype):
    ckpt = FOLDERS[kind](tmp_path / kind)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    heads = tmp_path / "heads" / kind
    model = f"{kind}:{ckpt}"
    cli("train-heads", "--model", model, "--prompts-file", str(prompts), "--out", str(heads), "--n-images", "4",
        "--steps", "5", "--dtype", dtype)
    assert heads.with_suffix(".safetensors").exists() and heads.with_suffix(".json").exists()
    if kind == "emu3":  # the grid the folder's image_area states, not Emu3-Gen's 90 x 90
        assert tuple(json.loads(heads.with_suffix(".json").read_text())["grid"]) == EMU3_GRID
    decoder = f"ssd+csd:heads={heads}:calibrated=false"
    grid = tmp_path / "grid.png"
    cli("sample", "--model", model, "--prompt", PROMPTS[0], "--n", "2", "--out", str(grid), "--decoder", decoder,
        "--dtype", dtype)
    assert grid.exists()
    write_parquet(s3, "ssdgen-test/in/p.parquet", [{"prompt_id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)])
    out = f"s3://ssdgen-test/run-{kind}-{dtype}"
    summary = run_flow(prompts=["s3://ssdgen-test/in/"], out=out, model=model, decoder=decoder, actors=1,
                       batch_size=4, shard_size=4)
    assert summary["images_ok"] == 4 and summary["images_failed"] == 0
    images, stats = committed_tables(out)
    assert images.num_rows == 4 and stats.num_rows == 4
    assert all(r["bytes"] for r in images.column("image").to_pylist())
    assert all(f >= 1 for f in stats.column("forwards").to_pylist())
    if kind == "emu3":  # 4 x 4 tokens at 2 x 2 pixels each
        assert Image.open(io.BytesIO(images.column("image").to_pylist()[0]["bytes"])).size == (8, 8)


def test_emu3_grid_from_the_folder_or_the_model_spec(tmp_path):
    """The grid: config.json's image_area, else 90 x 90; `:grid=RxC` or `:image_area=N` on the spec override
    it; a bad option is one line naming it, checked before any actor starts (check_model_spec)."""
    from ssdgen.models.registry import ModelSpec, check_model_spec, load_model
    ckpt = emu3_folder(tmp_path / "emu3")
    assert load_model(f"emu3:{ckpt}").grid == EMU3_GRID
    assert load_model(f"emu3:{ckpt}:grid=3x5").grid == (3, 5)
    assert load_model(f"emu3:{ckpt}:image_area=36").grid == (3, 3)  # 6 x 6 pixels
    config = json.loads((ckpt / "config.json").read_text())
    del config["image_area"]
    (ckpt / "config.json").write_text(json.dumps(config))
    assert load_model(f"emu3:{ckpt}").grid == (90, 90)  # Emu3-Gen's 720 x 720
    spec = ModelSpec.parse("emu3:/a:b/ckpt:grid=32x48")
    assert (spec.path, spec.grid, str(spec)) == ("/a:b/ckpt", (32, 48), "emu3:/a:b/ckpt:grid=32x48")
    for bad, says in [("emu3:/c:grid=32", "grid must be ROWSxCOLS"), ("emu3:/c:grid=0x4", "grid must be"),
                      ("emu3:/c:image_area=-5", "image_area must be a positive integer"),
                      ("emu3:/c:size=512", "unknown option 'size'; emu3 takes grid, image_area"),
                      ("janus:/c:grid=4x4", "janus takes no options"), ("emu3:/c:grid=2x2:grid=3x3", "twice"),
                      ("emu3:/c:grid=2x2:image_area=64", "not both"), ("emu3:grid=2x2", "no checkpoint path"),
                      ("emu3", "no checkpoint path"), ("llava:/c", "unknown model")]:
        with pytest.raises(ValueError, match=says) as e:
            check_model_spec(bad)
        assert "\n" not in str(e.value)


def test_fidelity_cli_on_a_tiny_janus_folder(tmp_path):
    """`ssdgen fidelity` on a Hugging Face model: NLL per token and the gap to AR (no scorer, so no FD or
    accuracy), lossless sjd judged indistinguishable."""
    ckpt = janus_folder(tmp_path / "janus")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS * 4) + "\n")
    out = tmp_path / "fidelity.json"
    cli("fidelity", "--model", f"janus:{ckpt}", "--prompts-file", str(prompts), "--decoders", "sjd:window=4",
        "--n", "16", "--batch-size", "8", "--json", str(out))
    res = json.loads(out.read_text())
    rows = {r["decoder"]: r for r in res["rows"]}
    assert res["n"] == 16 and set(rows) == {"ar", "sjd:window=4"}
    sjd = rows["sjd:window=4"]
    assert sjd["nll_per_token"] > 0 and sjd["forwards_per_image"] < rows["ar"]["forwards_per_image"]
    lo, hi = sjd["nll_gap_ci"]
    assert lo <= sjd["nll_gap"] <= hi and sjd["indistinguishable"]
    assert sjd["fd_to_ar"] is None and sjd["fd_noise_floor"] is None  # no scorer for this model
