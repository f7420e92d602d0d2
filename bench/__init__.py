"""Benchmarks, fidelity, reports, plots and projections: they measure the pipeline and its decoders and
are never imported by them (docs/benchmarks.md)."""
