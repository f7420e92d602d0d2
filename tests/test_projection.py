"""The GPU projection knows memory (bench/projection.py): the batch cap from weights + KV cache (CFG doubling the
rows), each decoder's best batch searched up to that cap and never above it, and the words that say whether AR
or speculation has the higher best-batch throughput. Pure arithmetic on hand-made bench rows: milliseconds."""

import json

import pytest

from ssdgen.bench import projection as P


def bench_of(*rows: tuple[str, int, float, float]) -> dict:
    """A bench JSON of (decoder, batch, forwards per image, query tokens per row) rows on a 16 x 16 grid."""
    return {"model": "toy", "device": "test", "date": None, "model_info": {"grid": [16, 16]},
            "rows": [{"decoder": d, "batch_size": b, "n": 64, "batches": 64 // b, "forwards_per_image": f,
                      "forwards_per_batch": f, "tokens_fed_per_forward": s} for d, b, f, s in rows]}


AR = ("ar", 1, 256.0, 1.0)
GOOD = ("sjd:window=4", 1, 64.0, 4.0)  # 4 tokens committed per forward of 4: nearly free where KV-bound
BAD = ("csd:window=64", 1, 250.0, 64.0)  # 64 query tokens per row for ~1 token: FLOPs spent for nothing
MID = ("csd:window=16", 1, 200.0, 16.0)  # 1.28 tokens per forward of 16


# ------------------------------------------------------------------------------------- (a) the memory cap

def test_the_cap_is_weights_plus_kv_by_hand_and_cfg_halves_it():
    h100, emu3 = P.ACCELERATORS["h100"], P.MODELS["emu3-8b"]
    # usable: 80 GB * 0.9 - 8.49e9 params * 2 B = 55.02 GB; KV per token: 2 (K, V) * 32 layers * 1024 * 2 B
    # = 131,072 B; AR caches prompt 120 + 8,100 grid + 1 query token = 8,221 tokens per row
    free, kv_tok, tokens = 72e9 - 16.98e9, 131_072, 8_221
    assert P.kv_bytes_per_token(emu3) == kv_tok
    with_cfg = free / (2 * kv_tok * tokens)  # 25.53: two rows per image
    without = free / (kv_tok * tokens)  # 51.06
    assert P.kv_cap(h100, emu3, 8100, cfg=True, spare=1) == int(with_cfg) == 25
    assert P.kv_cap(h100, emu3, 8100, cfg=False, spare=1) == int(without) == 51
    assert P.kv_cap(h100, emu3, 8100, cfg=True, spare=1) == P.kv_cap(h100, emu3, 8100, cfg=False, spare=1) // 2
    # 7B at 48 x 48 (MHA): (72 - 14) GB / (2 * 524,288 B * 2,425 tokens) = 22.8 -> 22, as docs/benchmarks.md says
    assert P.kv_cap(h100, P.MODELS["7b"], 48 * 48, cfg=True, spare=1) == 22
    # the projection's best AR batch is that cap (memory-bound AR only gets faster with more images)
    res = P.project(bench_of(AR), ["h100"], [("emu3-8b", 90)], [1], cfg=True)
    (ar,) = res["best"]
    assert ar["kv_cap_batch"] == 25 and ar["batch_size"] == 25 and ar["memory_capped"]
    off = P.project(bench_of(AR), ["h100"], [("emu3-8b", 90)], [1], cfg=False)["best"][0]
    assert off["kv_cap_batch"] == 51 and off["batch_size"] == 51


def test_weights_that_do_not_fit_leave_no_batch_and_no_verdict():
    tiny = P.Accelerator("tiny", 1e12, 1e14, 10e9, "test")  # 9 GB usable < 7B * 2 B of weights
    stats = P.decoder_stats(bench_of(AR, GOOD))
    b = P.best_batch(stats, "ar", tiny, P.MODELS["7b"], 48, True, 1.0, [1, 4])
    assert b["kv_cap_batch"] == 0 and b["batch_size"] is None and b["images_per_s"] is None and not b["fits"]
    v = P.verdict([b | {"decoder": "ar"}, b | {"decoder": "sjd"}], "tiny x 7b@48")
    assert v["winner"] is None and "no comparison" in v["words"]


def test_model_names_take_their_own_grid():
    assert P.parse_models("emu3-8b,janus-pro-7b,7b@48") == [("emu3-8b", 90), ("janus-pro-7b", 24), ("7b", 48)]
    assert P.parse_models("emu3-8b@32") == [("emu3-8b", 32)]
    with pytest.raises(ValueError, match="SIZE@GRID"):
        P.parse_models("7b")  # a shape without a grid of its own needs one


# ------------------------------------------------------------------------- (b) never above the cap

def test_the_best_batch_is_searched_up_to_the_cap_and_never_above_it():
    bench = bench_of(AR, GOOD, BAD, ("ar", 64, 256.0, 1.0), ("sjd:window=4", 64, 80.0, 4.0))
    given = [1, 3, 100_000]  # 100,000 images never fit: it is tried, seen not to fit and never chosen
    res = P.project(bench, ["l4", "h100", "h200"], [("7b", 48), ("emu3-8b", 90), ("1b", 24)], given)
    assert len(res["best"]) == 3 * 3 * 3
    for b in res["best"]:
        cap = b["kv_cap_batch"]
        assert b["fits"] and 1 <= b["batch_size"] <= cap, b
        assert 100_000 in b["searched"] and 3 in b["searched"] and cap in b["searched"]
        assert all(2 ** i in b["searched"] for i in range(cap.bit_length()) if 2 ** i <= cap)
        assert b["memory_capped"] == (b["batch_size"] == max(x for x in b["searched"] if x <= cap))
    # found beyond the given sizes: AR on h100 x 7b@48 is best at its cap, 22, not at 1 or 3
    ar = next(b for b in res["best"] if (b["accelerator"], b["model"], b["decoder"]) == ("h100", "7b", "ar"))
    assert ar["batch_size"] == 22 and ar["memory_capped"]
    # the 100,000 row of --batch-sizes is still shown, as not fitting
    assert any(r["batch_size"] == 100_000 and not r["fits"] and r["images_per_s"] is None for r in res["rows"])


def test_a_compute_bound_plateau_goes_to_the_smaller_batch_and_is_not_memory_capped():
    # one row of 64 query tokens makes every batch compute-bound on a 1B model: images/s flat from small b
    flat = bench_of(("csd:window=64", 1, 16.0, 64.0))
    b = P.project(flat, ["h100"], [("1b", 24)], [1])["best"][0]
    assert b["bound"] == "compute" and not b["memory_capped"] and b["batch_size"] < b["kv_cap_batch"]
    tried = [P.project_one(P.decoder_stats(flat)[0], P.ACCELERATORS["h100"], P.MODELS["1b"], 24, x, True, None)
             for x in b["searched"] if x <= b["kv_cap_batch"]]
    assert b["images_per_s"] == pytest.approx(max(t["images_per_s"] for t in tried))


# ------------------------------------------------------------------------------------ (c) the words

def _winner_by_numbers(v: dict, best: list[dict]) -> str:
    here = [b for b in best if (b["accelerator"], b["model"], b["grid"]) == (v["accelerator"], v["model"], v["grid"])]
    ar = max(b["images_per_s"] for b in here if b["decoder"] == "ar")
    spec = max(b["images_per_s"] for b in here if b["decoder"] != "ar")
    return "ar" if ar >= spec else "speculation"


def test_the_words_say_speculation_where_it_beats_ar_and_ar_where_ar_beats_every_speculative_best():
    good = P.project(bench_of(AR, GOOD), ["h100"], [("emu3-8b", 90)], [1, 4])
    (v,) = good["verdicts"]
    assert v["winner"] == "speculation" == _winner_by_numbers(v, good["best"])
    assert "speculation wins" in v["words"] and "AR wins" not in v["words"]
    assert v["words"].startswith("h100 x emu3-8b@90 (8100 tokens): best AR batch 25 (memory cap), sjd:window=4")
    assert v["ratio"] == pytest.approx(v["speculative"]["images_per_s"] / v["ar"]["images_per_s"]) and v["ratio"] > 1
    bad = P.project(bench_of(AR, BAD), ["h100"], [("1b", 24)], [1])
    (w,) = bad["verdicts"]
    assert w["winner"] == "ar" == _winner_by_numbers(w, bad["best"])
    assert "AR wins" in w["words"] and "speculation wins" not in w["words"] and w["ratio"] < 1
    # a middling window wins where AR is KV-bound (long grids, big models) and loses where its batch turns
    # compute-bound first; AR must beat every speculative best (BAD as well) to win
    mixed = P.project(bench_of(AR, MID, BAD), ["h100", "h200", "a100-40gb"], [("emu3-8b", 90), ("1b", 24)], [1])
    winners = {(v["accelerator"], v["model"]): v["winner"] for v in mixed["verdicts"]}
    assert winners[("h100", "emu3-8b")] == "speculation" and winners[("h100", "1b")] == "ar"
    for v in mixed["verdicts"]:
        assert v["winner"] == _winner_by_numbers(v, mixed["best"])
        assert ("AR wins" in v["words"]) == (v["winner"] == "ar") != ("speculation wins" in v["words"])


def test_the_best_section_reaches_the_json_the_text_and_the_page():
    res = P.project(bench_of(AR, GOOD), ["h100", "l4"], [("emu3-8b", 90)], [1, 4])
    json.loads(json.dumps(res))
    assert {"best", "verdicts"} <= set(res) and len(res["best"]) == 2 * 2
    assert all(b["usd_per_1k_images"] is not None for b in res["best"])  # both have a price row
    text = "\n".join(P.text_table(res))
    assert "best batch per decoder" in text and "memory cap" in text
    assert all(v["words"] in text for v in res["verdicts"])
    page = P.projection_html(res)
    assert "Best batch per decoder" in page and "Where speculation wins" in page and "memory cap" in page


# ------------------------------------------------------- (d) tokens per forward from the spec that decoded

def test_tokens_fed_follow_the_resolved_spec_not_the_family_name():
    """A calibrated ssd+csd row resolved to a window of 5 tokens feeds 5 on any grid (#47: the projection once
    scaled every ssd* row with the grid's width); a window of rows grows with the width up to the window loop's 64;
    the block decoder's rows grow without bound; plain AR feeds 1."""
    rows = [{"decoder": "ssd+csd", "spec": "ssd+csd", "plan_spec": "ssd+csd:calibrated=false:lam=1.0:window=5",
             "batch_size": 1, "n": 64, "batches": 64, "forwards_per_image": 80.0, "forwards_per_batch": 80.0,
             "tokens_fed_per_forward": 4.6},
            {"decoder": "ssd:rows=1", "batch_size": 1, "n": 64, "batches": 64, "forwards_per_image": 100.0,
             "forwards_per_batch": 100.0, "tokens_fed_per_forward": 17.0},
            {"decoder": "ssd:commit=block:rows=1", "batch_size": 1, "n": 64, "batches": 64,
             "forwards_per_image": 60.0, "forwards_per_batch": 60.0, "tokens_fed_per_forward": 17.0}]
    bench = {"model": "toy", "device": "test", "date": None, "model_info": {"grid": [16, 16]}, "rows": rows}
    st = {s.decoder: s for s in P.decoder_stats(bench)}
    assert st["ssd+csd"].fed_at(48) == pytest.approx(4.6) and st["ssd+csd"].fed_at(90) == pytest.approx(4.6)
    assert st["ssd:rows=1"].fed_at(48) == pytest.approx(17 * 49 / 17) and st["ssd:rows=1"].fed_at(90) == 64
    assert st["ssd:commit=block:rows=1"].fed_at(48) == pytest.approx(49)
    res = P.project(bench, ["h100"], [("7b", 48)], [1])
    fed = {r["decoder"]: r["tokens_fed_per_row"] for r in res["rows"]}
    assert fed["ssd+csd"] == pytest.approx(4.6)  # was 4.6 * 48 / 16 = 13.8: the overstatement #47 names
    assert all(b["speculative"] for b in res["best"])


def test_an_older_bench_row_without_tokens_fed_takes_them_from_its_spec():
    old = {"model": "toy", "device": "test", "date": None, "model_info": {"grid": [16, 16]},
           "rows": [{"decoder": d, "batch_size": 1, "n": 8, "batches": 8, "forwards_per_image": f}
                    for d, f in (("ar", 256.0), ("csd", 100.0), ("ssd+csd", 80.0), ("ssd+csd:window=5", 90.0))]}
    st = {s.decoder: s for s in P.decoder_stats(old)}
    # csd's window is its recipe's 33; ssd+csd's 2 rows of 16 and the last committed token; a window's own L
    assert {d: s.tokens_fed_per_forward for d, s in st.items()} == {"ar": 1, "csd": 33, "ssd+csd": 33,
                                                                   "ssd+csd:window=5": 5}
    assert not st["ar"].derived and all("tokens_fed_per_forward" in st[d].derived for d in st if d != "ar")
    assert [s.speculative for s in st.values()] == [False, True, True, True]
