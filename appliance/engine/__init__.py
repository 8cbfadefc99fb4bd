"""Running a loaded model version: request and response types, validation, the per-model schedulers
(dynamic batching, sequences), instances, decoupled streaming and statistics. Knows no transport and no
repository: the repository package builds what the engine runs."""
