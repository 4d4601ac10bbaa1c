"""The runtime: where a method's three stages meet the engines, the backends, Ray and the data plane.

It is split into rooms, each importing only itself and the rooms below it (bottom first; checked by
tests/structure/test_layers.py):

    data < metrics < weights < step < files < checks < preflight < session < cluster < driver
"""
