"""`python -m jobcoord`: the `jobcoord` command."""

from .start import main

main()
