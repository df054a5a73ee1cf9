"""The shared recipe library: loaders and helpers that more than one recipe uses.

Not a recipe (no recipe.toml): `recipes/_lib/` is baked into the image with the recipes and the
runtime puts it on the recipe's path, so a recipe imports ``recipelib.<module>``. Its code digest
is recorded beside the recipe's (``recipe.lib_digest`` in the manifest): an edit here is a code
change of every recipe that runs with it.
"""
