"""What this box has: CPU, memory, accelerators and runtimes. A library with no HTTP in it."""
