"""``python -m minidist ...``: the same as the ``minidist`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
