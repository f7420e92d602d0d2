"""`python -m lab COMMAND`: the lab's command line (lab/cli.py), from a checkout's root."""

from lab.cli import main

main()
