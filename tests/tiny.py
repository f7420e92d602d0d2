"""Re-export for the tests: the tiny random model lives in reference/tiny.py (the scaling benchmark uses it too)."""

from reference.tiny import tiny_model  # noqa: F401
