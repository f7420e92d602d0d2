"""The lab: the research around ssdgen, kept apart from the product as nanochat keeps `scripts/` apart from
`nanochat/`. It imports `ssdgen` and is never installed (pyproject's packages leave it out, so the wheel holds
none of it); run it from a checkout, in its venv: `.venv/bin/python -m lab COMMAND` (lab/cli.py).

    lab/cli.py         the commands `ssdgen dev` had, under the same names and options
    lab/reference/     the reference model's training (tokenizer, transformer, scorer), its checks, the figures
    lab/bench/         the research benchmarks: the roofline, host time, shape replay, the projection's check,
                       scaling, the pipeline at scale and its shard overhead, planning, image formats
    lab/results/       the scripts behind docs/results/ (their outputs stay there, where the docs link them)
"""
