"""A tool that needs a person's approval, as a plugin file listed in loopwright.yaml's `plugins:`."""

from collections.abc import Callable
from pathlib import Path

import loopwright


@loopwright.tool(requires_approval=True, parallel_safe=False)
def publish(title: str) -> str:
    """Publish a post: appends its title to .loopwright/published.txt. A person approves each call first.

    Args:
        title: The title of the post.
    """
    # Under .loopwright/, beside the store: the one folder an example writes to (git-ignored).
    out = Path(".loopwright")
    out.mkdir(exist_ok=True)
    with (out / "published.txt").open("a", encoding="utf-8") as f:
        f.write(title + "\n")
    return f"published {title!r}"


@loopwright.hookimpl
def loopwright_register_tools(register: Callable[..., None]) -> None:
    register(publish)
