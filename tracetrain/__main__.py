"""`python -m tracetrain`: the same as the `tracetrain` console script."""

from tracetrain.cli import main

main()
