"""Running under systemd: sd_notify, the watchdog, and installing the unit."""
