"""The weight route from the actor to the rollout engines: what is published (the engine's dtype) and
the transport that carries it (``--weight-transport``: the object store, or a collective broadcast).
"""
