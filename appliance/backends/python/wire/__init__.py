"""What the daemon and a model process share: the channel between them and the shared-memory arenas."""
