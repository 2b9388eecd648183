"""A sibling module model.py imports (Triton puts the version folder on sys.path)."""

FACTOR = 10.0
