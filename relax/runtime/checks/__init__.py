"""The rules a configuration must pass before anything starts, and what it implies: the roles a run
needs, the batch shape, the defaults ``run`` derives, whether the cluster fits.
"""
