"""Subcommands of the ``legionpy`` command, one module each.

A module registers its subcommand with :func:`legionpy.cli.command`; add its
name to :data:`MODULES` (the order is the order of ``legionpy --help``).
"""

MODULES = ["demo", "search", "simulate", "zoo", "train", "profile", "compare_traces"]
