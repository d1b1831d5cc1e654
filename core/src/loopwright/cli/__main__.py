"""``python -m loopwright.cli``: the same as the ``loopwright`` console script."""

from __future__ import annotations

from loopwright.cli import main

if __name__ == "__main__":
    main()
