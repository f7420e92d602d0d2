"""Waste: query tokens the model computed per committed token (`SampleStats.tokens_fed` / N, both CFG rows),
counted by each decoder's Tally. Plain AR feeds one token per forward per row (the prefill's last position
drawing token 0), so it wastes exactly 1 per row; a window of L tokens feeds L per forward. The counts are
checked against the model calls themselves, counted from outside the decoders."""

import pyarrow as pa
import pytest

from ssdgen.decoders import decode
from ssdgen.decoders.recipes import SamplingConfig
from ssdgen.decoders.sample_stats import stat_columns
from test_decoders import PROMPTS
from tiny import tiny_with_heads

CFG = SamplingConfig(cfg_scale=3.0)
NO_CFG = SamplingConfig(cfg_scale=1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny") / "t")


class _Fed:
    """Counts the query tokens the decoder hands the model: the prefill's one query position per row, then
    every `step`'s tokens, both CFG rows. For a batch of 1, that is the sample's own tokens_fed."""

    def __init__(self, model, cfg: bool):
        self.model, self.rows, self.total = model, 2 if cfg else 1, 0

    def __enter__(self):
        step = self.model.step

        def counted(tokens, index, lengths=None, **kw):  # lengths: a packed step computes these entries only
            self.total += (tokens.numel() if lengths is None else int(lengths.sum())) * self.rows
            return step(tokens, index, lengths, **kw)

        self.model.step = counted
        self.total = self.rows  # the prefill draws token 0 from one position per row
        return self

    def __exit__(self, *exc):
        del self.model.step  # back to the class's method
        return False


@pytest.mark.parametrize("sc, want", [(CFG, 2.0), (NO_CFG, 1.0)])
def test_ar_wastes_exactly_one_token_per_row(tiny, sc, want):
    res = decode("ar", tiny, PROMPTS, list(range(4)), sc)
    N = tiny.grid[0] * tiny.grid[1]
    assert [s.waste for s in res.stats] == [want] * 4
    assert [s.tokens_fed for s in res.stats] == [int(want) * N] * 4


@pytest.mark.parametrize("L", [4, 6])
def test_a_padded_window_feeds_its_whole_window_every_forward(tiny, L):
    res = decode("sjd", tiny, PROMPTS * 2, list(range(8)), CFG, {"window": L, "packed": False})
    N = tiny.grid[0] * tiny.grid[1]
    forwards = [s.forwards for s in res.stats]
    assert len(set(forwards)) > 1  # samples finish at different forwards: the count is per sample
    for s in res.stats:
        # the prefill's one position, then L tokens per forward after it, in both CFG rows
        assert s.tokens_fed == 2 * (1 + L * (s.forwards - 1))
        assert s.waste == pytest.approx(2 * (1 + L * (s.forwards - 1)) / N)
        assert s.waste > 2.0  # a window computes more than it commits


@pytest.mark.parametrize("name, params, sc", [
    ("ar", {}, CFG), ("ar", {}, NO_CFG), ("sjd", {"window": 5}, CFG), ("sjd", {"window": 5}, NO_CFG),
    ("sjd", {"window": 5, "packed": False}, CFG), ("sjd", {"window": 8, "adaptive": True}, CFG),
    ("ssd", {"lossless": True, "window": 8, "adaptive": True}, CFG),
    ("ssd", {"lossless": True, "rows": 1}, CFG), ("ssd", {"rows": 2, "rounds": 1, "commit": "block"}, CFG),
])
def test_tokens_fed_is_what_the_model_was_given(tiny, name, params, sc):
    for seed in range(3):
        with _Fed(tiny, sc.uses_cfg) as fed:
            res = decode(name, tiny, PROMPTS[:1], [seed], sc, params)
        assert res.stats[0].tokens_fed == fed.total


def test_a_packed_window_stops_at_the_image_end_and_costs_less_than_a_padded_one(tiny):
    packed = decode("sjd", tiny, PROMPTS * 2, list(range(8)), CFG, {"window": 6})
    padded = decode("sjd", tiny, PROMPTS * 2, list(range(8)), CFG, {"window": 6, "packed": False})
    assert packed.tokens.equal(padded.tokens)  # the same real tokens computed: the same decode
    for a, b in zip(packed.stats, padded.stats):
        assert a.forwards == b.forwards and a.tokens_fed <= b.tokens_fed
    # a last window that would run past the image is cut there
    assert sum(s.tokens_fed for s in packed.stats) < sum(s.tokens_fed for s in padded.stats)


def test_adaptive_windows_feed_less_than_the_full_window(tiny):
    full = decode("sjd", tiny, PROMPTS * 2, list(range(8)), CFG, {"window": 8, "coupled": True})
    adaptive = decode("sjd", tiny, PROMPTS * 2, list(range(8)), CFG, {"window": 8, "coupled": True, "adaptive": True})
    assert sum(s.tokens_fed for s in adaptive.stats) < sum(s.tokens_fed for s in full.stats)
    assert all(s.extra["window_sizes"] == "adaptive" for s in adaptive.stats)


def test_waste_is_a_stats_column(tiny):
    cols = dict(stat_columns())
    assert cols["waste"] == "float64" and cols["tokens_fed"] == "int32"
    row = decode("sjd", tiny, PROMPTS[:1], [0], CFG, {"window": 4}).stats[0].to_row()
    assert row["waste"] == row["tokens_fed"] / 16 and row["waste"] > 2.0


def test_the_stats_table_holds_the_waste_column(tiny):
    from ssdgen.output.layout import STATS_SCHEMA, shard_tables
    from ssdgen.workers.results import Sample
    assert STATS_SCHEMA.field("waste").type.equals(pa.float64())
    assert STATS_SCHEMA.field("tokens_fed").type.equals(pa.int32())
    st = decode("sjd", tiny, PROMPTS[:1], [0], CFG, {"window": 4}).stats[0]
    rows = [{"prompt_id": "p0", "prompt": PROMPTS[0], "seed": 0}, {"prompt_id": "p1", "prompt": PROMPTS[1], "seed": 1}]
    samples = {"p0": Sample("p0", "ok", grid=tiny.grid, stats=st.to_row()),
               "p1": Sample.failed("p1", "boom", "decode_failed")}
    _, stats = shard_tables(samples, rows, "sjd", "tiny")
    assert stats.column("waste").to_pylist() == [st.waste, None]
    assert stats.column("tokens_fed").to_pylist() == [st.tokens_fed, None]

