"""On-device metrics: SQLite history, Prometheus (Triton's names), system samples, events."""
