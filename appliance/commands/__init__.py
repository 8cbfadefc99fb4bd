"""Subcommands of the ``appliance`` CLI besides ``serve``: one module each, with add_parser and run."""
