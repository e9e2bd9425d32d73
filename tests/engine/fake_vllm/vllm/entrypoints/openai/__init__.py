"""Fake vLLM for launcher tests (on PYTHONPATH of the child only)."""
