"""What guards the daemon: the control token, signed fleet requests, and the memory budget every request's
bytes are counted in."""
