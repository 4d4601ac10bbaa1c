"""The configuration layer, at the bottom of the package: the run's settings (``relax.config.run``),
the hyper-parameters every method shares (``relax.config.algorithm``) and the field rules
(``relax.config.fields``).

Each setting is one attrs field that declares its flag and its rule once; every layer above imports
the configuration type it reads. Standard library and attrs only.
"""
