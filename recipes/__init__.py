"""The recipes: `make demo` and `make cram` over the scripts, with their shared stage runner. Not installed with the
sinebert package; run them from the repository root (`python -m recipes.demo`, `python -m recipes.cram`)."""
