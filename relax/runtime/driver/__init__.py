"""The driver: ``run(config)``, the step pipeline, evaluation during training, and saving and restoring
checkpoints through the live roles. The runtime's top room.
"""
