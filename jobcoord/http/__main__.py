"""`python -m jobcoord.http ARGS`: the `jobcoord` command with `serve`, `token` and the
remote `worker` registered (the same commands `jobcoord` itself offers once registered)."""

from ..cli import cli, main
from .commands import register

if "serve" not in cli.commands:
    register(cli)
main()
