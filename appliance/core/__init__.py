"""The core: model repository, configs, registry and per-model scheduling. No HTTP in here."""
