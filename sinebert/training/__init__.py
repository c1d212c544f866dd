"""What the scripts share: data loading and collators, the training loop, checkpoints, metrics and reports.

This package is not needed to load or serve a model; the model files import nothing from it.
"""
