"""Per-model cache of the chosen backend plan and its compiled artefacts. A library with no HTTP in it."""
