"""The generator's CLI commands, dispatched from the one `dpone` entry point in dpone-runtime."""

from __future__ import annotations

from collections.abc import Callable


def main(command: str, argv: list[str]) -> int:
    from .check import main_check
    from .preview import main_preview

    handlers: dict[str, Callable[[list[str]], int]] = {
        "check": main_check,
        "preview": main_preview,
    }
    if command == "generate":
        from .cli import main_generate

        return main_generate(argv)
    return handlers[command](argv)
