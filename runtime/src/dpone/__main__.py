"""`python -m dpone` is the same as the `dpone` command."""

from dpone.cli import entry

entry()
