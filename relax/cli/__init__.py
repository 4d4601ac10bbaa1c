"""The ``relax`` command line: ``relax train`` and ``relax algorithms``.

Parsing and validation never import ray; ``relax train`` imports the runtime only after the
configuration has been accepted.
"""
