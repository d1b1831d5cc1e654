"""A tiny MCP server over stdio: a dictionary with one tool, written with the mcp SDK (MCPServer).

loopwright starts it as a child process (see loopwright.yaml) and talks to it on stdin/stdout.
Run it alone with ``python server.py``: it then waits for an MCP client on stdin.
"""

from mcp.server.mcpserver import MCPServer

server = MCPServer("dictionary")

WORDS = {
    "a": "the first letter of the alphabet; also the indefinite article",
    "loop": "a shape that bends round and crosses itself; a sequence run again and again",
}


@server.tool()
def define(word: str) -> str:
    """Look a word up in the dictionary."""
    meaning = WORDS.get(word.lower())
    if meaning is None:
        msg = f"no entry for {word!r}"
        raise ValueError(msg)
    return f"{word}: {meaning}"


if __name__ == "__main__":
    server.run()
