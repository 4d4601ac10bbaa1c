"""The live roles of a run: the Runtime that places and starts the workers (on Ray, or in one process),
the warm worker pool, the reward services and the kept cluster.
"""
