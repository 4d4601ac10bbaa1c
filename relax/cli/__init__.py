"""The ``relax`` command line: ``relax train``, ``relax sft``, ``relax algorithms``, ``relax plot`` and ``relax cluster``.

Parsing and validation never import ray; ``relax train`` imports the runtime only after the
configuration has been accepted.
"""
