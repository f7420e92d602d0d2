"""ssdgen: batch image generation with speculative decoders for AR image transformers. The command line is
ssdgen/cli.py; README.md says what is where. From Python, `ssdgen.open_run(URL)` reads a run's committed
output and `ssdgen.export(URL, DIR, fmt)` copies it into a flat folder (ssdgen/api.py)."""

__all__ = ["open_run", "export", "committed_shards"]


def __getattr__(name: str):
    # lazy: `import ssdgen` (every CLI start) must not import pyarrow and the flows
    if name in __all__:
        from ssdgen import api
        return getattr(api, name)
    raise AttributeError(f"module 'ssdgen' has no attribute {name!r}")
