"""The research benchmarks, apart from the product's bench/ (`ssdgen bench`, `fidelity`, `projection`,
`report`): each is a `python -m lab` command (lab/cli.py)."""
