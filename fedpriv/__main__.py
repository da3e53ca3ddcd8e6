"""``python -m fedpriv new APP_DIR --template tabular|image|text``: write a Flower app of
one's own task (``fedpriv.new``). A bad argument is one ``prog: error:`` line, exit 2."""

from __future__ import annotations

from pathlib import Path

from fedpriv.cli import Parser
from fedpriv.templates import TEMPLATES


def main(argv: list[str] | None = None) -> Path:
    parser = Parser(prog="python -m fedpriv", description="fedpriv's app tools")
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new", help="write an app of your own model and data (a task) from a template")
    new.add_argument("app_dir", metavar="APP_DIR", type=Path, help="the app's folder (new, or empty)")
    new.add_argument("--template", choices=TEMPLATES, default="tabular", help="the task to start from "
                                                                                "(default: tabular)")
    args = parser.parse_args(argv)
    from fedpriv.new import new_app

    try:
        app = new_app(args.app_dir, args.template)
    except ValueError as err:
        parser.error(str(err))
    print(f"wrote {app}: task.py, pyproject.toml, README.md, data/ (template {args.template}); "
          f"simulate it with python -m simulations.run --app {app} --clients 2 --out runs/{app.name}")
    return app


if __name__ == "__main__":
    main()
