"""What the scripts share: data loading and collators, the training loop, checkpoints, metrics and reports.

This package is not needed to load or serve a model; the model files import nothing from it. It needs the `train`
extra (`pip install "sinebert[train]"`, or `".[train]"` from a clone), which serving does not.
"""

import importlib.util

# The import name of each package of the `train` extra that this package uses.
_TRAIN_EXTRA = ("accelerate", "datasets", "evaluate", "yaml", "matplotlib", "seqeval", "sklearn", "scipy", "tqdm")
_missing = [name for name in _TRAIN_EXTRA if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(
        f"sinebert.training needs {', '.join(_missing)}, which come with the train extra: "
        'pip install "sinebert[train]" (serving a model needs only the sinebert package itself).'
    )
