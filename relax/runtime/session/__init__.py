"""Ray itself: starting or joining it, shipping the user's code, bounded waits and heartbeats that
name a dead or stuck worker, the reaper of a run's processes, and the Serve deployments.
"""
