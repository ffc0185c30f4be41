"""`dif bench`: fresh-process benchmarks at the user's boundary, from a literal prompt to a saved file.

Where it sits: outside the compile/run pipeline, around it. `recipe` reads and checks a
"dif-bench-recipe/1" JSON chain of stages, `runner` runs each stage as a child process and measures it
from the outside (`residency`: page cache of the model files, `nvml`: device memory and power, `outputs`:
the files it must produce, decoded). No torch, no GPU library needed; pynvml is optional.
"""

from dif.bench.recipe import KIND, Recipe, RecipeError, Stage, load_recipe, parse_recipe
from dif.bench.runner import BenchResult, run_recipe, run_stage, summarize

__all__ = [
    "KIND",
    "BenchResult",
    "Recipe",
    "RecipeError",
    "Stage",
    "load_recipe",
    "parse_recipe",
    "run_recipe",
    "run_stage",
    "summarize",
]
