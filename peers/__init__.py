"""The implementations no one here wrote that tests and benchmarks compare ours with.

Dev-only: each module imports its peer (a dev dependency in pyproject.toml) when called.
"""
