"""The daemon process's own plumbing: the event loop, ordered start and stop, the state directory's health,
bounded log repetition and the C allocator's thresholds."""
