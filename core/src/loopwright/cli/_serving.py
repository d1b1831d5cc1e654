"""The commands that serve until stopped: ``worker``, ``serve`` (HTTP) and ``mcp-serve`` (MCP over stdio).

Each runs until SIGTERM or Ctrl-C (``mcp-serve``: until the client closes stdin) and returns its
exit code. The worker loop (:mod:`loopwright.cli._worker`) and the servers of the
loopwright-serve package are imported only by the command that runs them; without that package
``serve`` and ``mcp-serve`` say how to install it (exit 2).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from loopwright.cli._exits import EXIT_OK, EXIT_USAGE, CliError
from loopwright.cli._opening import sync

if TYPE_CHECKING:
    from loopwright._runtime import Runtime
    from loopwright.cli._settings import CliSettings

__all__ = ["mcp_serve", "server", "worker"]


@sync
async def worker(settings: CliSettings, poll: float, max_concurrent: int, once: bool, grace: float) -> int:
    """``loopwright worker``: run the work other processes leave in the store until stopped."""
    from loopwright.cli._worker import worker as serve  # noqa: PLC0415 - only for worker, for a cheap start

    return await serve(settings, poll, max_concurrent, once, grace)


def _runtime_from_file(settings: CliSettings) -> Runtime:
    """Return ``Runtime.from_file`` of the assembly the options name (no terminal approver)."""
    from loopwright._runtime import Runtime  # noqa: PLC0415 - the runtime only for commands that open one: keeps ls and show cheap

    return Runtime.from_file(settings.assembly_path())


def server(settings: CliSettings, host: str, port: int) -> int:
    """``loopwright serve``: the HTTP API over the assembly's store, until SIGTERM or Ctrl-C.

    Prints the URL it listens on (the real port for ``--port 0``) on one line of stdout, flushed,
    before it serves; without ``server.tokens`` it says on stderr that it answers loopback only.
    """
    try:
        # The server, Starlette and uvicorn only for this command: the CLI's start-up stays cheap,
        # and the core does not depend on them.
        import loopwright_serve  # noqa: PLC0415
        from loopwright_serve._server import ui_lines  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(f'loopwright serve needs the loopwright-serve package: pip install "loopwright[serve]" '
                       f"({exc})", EXIT_USAGE) from None
    rt = _runtime_from_file(settings)
    server_settings = loopwright_serve.ServerSettings.from_runtime(rt)
    server_settings.check_host(host)
    app = loopwright_serve.build_app(loopwright_serve.ServeContext(rt, server_settings))

    def announce(url: str) -> None:
        click.echo(f"loopwright serve: listening on {url}")
        for line in ui_lines(url, server_settings):
            click.echo(line)
        sys.stdout.flush()
        if not server_settings.tokens:
            click.echo("loopwright serve: no tokens in the assembly's server: key, so it answers loopback only, "
                       "and every request may do everything (docs/serve.md)", err=True)

    loopwright_serve.run_server(app, host, port, announce=announce)
    return EXIT_OK


def mcp_serve(settings: CliSettings) -> int:
    """``loopwright mcp-serve``: the registered agents as MCP tools over stdio, until the client closes stdin."""
    try:
        # The MCP server lives in loopwright-serve, with the mcp SDK: imported only for this command.
        from loopwright_serve._mcp_server import serve_stdio  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(f'loopwright mcp-serve needs the loopwright-serve package: pip install "loopwright[serve]" '
                       f"({exc})", EXIT_USAGE) from None
    config = settings.assembly_path()
    import anyio  # noqa: PLC0415 - the event loop only for commands that need one: keeps ls and show cheap

    anyio.run(serve_stdio, str(config) if config is not None else None)
    return EXIT_OK
