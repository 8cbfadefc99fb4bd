"""Edge inference appliance: a Triton-compatible (KServe v2 REST and gRPC) inference daemon for edge boxes."""

# The one place the version is written (pyproject.toml reads it; CHANGELOG.md says what each one brought).
__version__ = "0.1.0"
