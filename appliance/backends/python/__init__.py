"""Triton's Python backend: model.py files run unchanged, one process per instance."""
