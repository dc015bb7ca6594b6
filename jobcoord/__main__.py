"""`python -m jobcoord`: the `jobcoord` command."""

from .cli import main

main()
