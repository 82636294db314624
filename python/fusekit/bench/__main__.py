"""python -m fusekit.bench: the command line (fusekit.bench.cli.main)."""
from .cli import main

main()
