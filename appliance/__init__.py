"""Edge inference appliance: a Triton-compatible (KServe v2 REST) inference daemon for edge boxes."""

__version__ = "0.1.0"
