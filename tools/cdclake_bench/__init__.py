"""Benchmarks of the load job against its peers (`python -m cdclake bench`)."""
