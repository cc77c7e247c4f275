"""`python -m fi_convert` runs the CLI."""

from .cli import main

main()
