"""`launcher recipes list|show|new`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from launcher.cli.common import command, render, stdout, workspace_of
from launcher.cli.params import complete_recipe, group
from launcher.result import D, Result
from launcher.specs import recipes

app = group("recipes", "The workspace's training recipes (recipes/NAME/recipe.toml).")


@command(app, "ls", aliases=("list",))
def list_cmd(ctx: typer.Context) -> None:
    """List the recipes of the workspace."""
    ws = workspace_of(ctx)
    found = recipes.list_recipes(ws)
    data = {"recipes": [{"name": r.name, "framework": r.framework, "description": r.spec.description,
                         "path": str(r.path), "tree_digest": r.tree_digest} for r in found]}

    def text(_: Result[D]) -> None:  # the summary and the recipes, not the data
        if not found:
            stdout.print(f"no recipes in {ws.recipes} (create one with `launcher recipes new NAME`)")
            return
        table = Table("recipe", "framework", "description", box=None)
        for r in found:
            table.add_row(r.name, r.framework, r.spec.description)
        stdout.print(table)

    render(ctx, Result("recipes ls", data, summary=f"{len(found)} recipes"), text)


@command(app, "show")
def show_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="RECIPE", autocompletion=complete_recipe,
                                        help="A recipe name, a recipe folder or a .py script.")],
) -> None:
    """Show a recipe: entry, params with defaults and allowed values, datasets and their expected fingerprints."""
    recipe = recipes.load_recipe(workspace_of(ctx), name)

    def text(_: Result[D]) -> None:  # the summary and the recipes, not the data
        s = recipe.spec
        stdout.print(f"[bold]{s.name}[/] ({s.framework}) {s.description}")
        stdout.print(f"  path   {s.path}\n  entry  {s.entry}\n  tree   {recipe.tree_digest}")
        if s.variant:
            stdout.print(f"  image  the {s.variant} variant (--variant overrides)")
        if s.params:
            stdout.print("  params (default; allowed values)")
            for key, value in s.params.items():
                ps = s.param_specs.get(key)
                allowed = f"  [dim]({escape(ps.allowed())})[/]" if ps else ""
                note = f"  {escape(ps.help)}" if ps and ps.help else ""
                stdout.print(f"    {key} = {escape(json.dumps(value))}{allowed}{note}")  # as TOML writes it
        for d in s.datasets:
            files = ", ".join(f"{k} {v[:19]}…" for k, v in d.files.items())
            expected = d.fingerprint or files or "not pinned"
            stdout.print(f"  dataset {d.param}={d.name} ({d.source}): {d.format}\n    expected: {expected}")
        if s.outputs:
            stdout.print(f"  outputs {', '.join(s.outputs)}")

    render(ctx, Result("recipes show", recipe.as_dict(), summary=f"{recipe.name}"), text)


@command(app, "new")
def new_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The new recipe's name (a folder under recipes/).")],
    framework: Annotated[str, typer.Option(
        "--framework", metavar=f"[{'|'.join(recipes.scaffolded_frameworks())}]",
        autocompletion=lambda: recipes.scaffolded_frameworks(),
        help="The framework train.py is written for (its recipe.toml names that framework's image).")] = "tensorflow",
) -> None:
    """Scaffold recipes/NAME/ with a recipe.toml and a train.py that runs as it is."""
    recipe = recipes.scaffold_recipe(workspace_of(ctx), name, framework)
    render(ctx, Result("recipes new", recipe.as_dict(),
                       summary=f"created {recipe.path} (edit train.py, then `launcher run {recipe.name}`)"))

