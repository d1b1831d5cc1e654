#!/usr/bin/env python3
"""Time to first token added by loopwright: a streaming fake model, read directly and through ``/openai/v1``.

    python bench/ttft.py                      # 40 streams one at a time, then 3 rounds of 100 at once
    python bench/ttft.py --concurrency 1 10 100 --rounds 50 --many-rounds 5

Three processes on this machine, all on 127.0.0.1:

* a fake OpenAI Chat Completions server (this script with ``--fake``, on asyncio) that streams
  every answer: the role, then after ``--first-ms`` the first token, then ``--tokens`` more every
  ``--gap-ms``. It notes, per request, when the request arrived and when it wrote the first
  token (``time.monotonic()``, the system-wide monotonic clock every process here shares);
* ``loopwright serve`` over an assembly whose agent's model is that server (``kind: openai``);
* this process: ``openai.AsyncOpenAI`` clients, which ask for ``stream=True`` completions, at
  ``C`` concurrent streams, of the fake server itself (**direct**) and of ``loopwright/talker`` on
  ``/openai/v1`` (**loopwright**), and note when the first content chunk arrives.

For each request, *added* is the time from the fake server writing its first token to the client
reading its first content chunk. Direct, that is the wire and the client's own parsing; through
loopwright it adds the provider's parse, the engine's event, the live channel, the surface and
uvicorn. The figure reported for loopwright is its median and p95 *minus the direct median*
at the same concurrency (what loopwright adds), beside the raw figures. ``start`` is the time
from the client sending the request to the model receiving one (loopwright creates and saves the
instance first). Not a test: the figures go to bench/RESULTS.md; ``--json PATH`` writes them too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
MARKER = re.compile(rb"\[\[ttft:([0-9a-f]{32})\]\]")
#: Seconds before a round counts as hung.
GUARD = 120.0


# -- the fake model server ------------------------------------------------------------------


class _Fake(asyncio.Protocol):
    """A bare HTTP/1.1 server streaming Chat Completions chunks (keep-alive, Content-Length bodies)."""

    seen: dict[str, dict[str, float]] = {}  # noqa: RUF012 - one table per server process
    first_s = 0.02
    gap_s = 0.005
    tokens = 16

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            declared = re.search(rb"(?i)content-length:\s*(\d+)", head)
            length = int(declared.group(1)) if declared else 0
            if len(rest) < length:
                return
            body, self.buffer = rest[:length], rest[length:]
            arrived = time.monotonic()
            if head.startswith(b"GET /stats"):
                payload = json.dumps(self.seen).encode()
                self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                     b"\r\n%s" % (len(payload), payload))
                continue
            found = MARKER.search(body)
            key = found.group(1).decode() if found else uuid.uuid4().hex
            self.seen[key] = {"arrived": arrived}
            asyncio.get_running_loop().create_task(self._stream(key))

    async def _stream(self, key: str) -> None:
        write = self._chunk
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
        write({"role": "assistant", "content": ""})
        await asyncio.sleep(self.first_s)
        write({"content": "Once"})
        self.seen[key]["first_token"] = time.monotonic()
        for n in range(self.tokens):
            await asyncio.sleep(self.gap_s)
            write({"content": f" t{n}"})
        write({}, "stop")
        usage = {"prompt_tokens": 10, "completion_tokens": self.tokens + 1, "total_tokens": self.tokens + 11}
        self._data({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [],
                    "usage": usage})
        self._frame(b"data: [DONE]\n\n")
        self.transport.write(b"0\r\n\r\n")

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> None:
        self._data({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def _data(self, body: dict[str, Any]) -> None:
        self._frame(b"data: " + json.dumps(body).encode() + b"\n\n")

    def _frame(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))


async def _serve_fake(first_ms: float, gap_ms: float, tokens: int) -> None:
    _Fake.first_s, _Fake.gap_s, _Fake.tokens = first_ms / 1000, gap_ms / 1000, tokens
    server = await asyncio.get_running_loop().create_server(_Fake, "127.0.0.1", 0, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


# -- the clients ----------------------------------------------------------------------------


async def _one(client: Any, model: str) -> dict[str, float | str]:
    key = uuid.uuid4().hex
    sent = time.monotonic()
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"tell a story [[ttft:{key}]]"}], stream=True)
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic()
    assert first is not None, "no content chunk came"
    return {"key": key, "sent": sent, "first_chunk": first}


async def _round(client: Any, model: str, concurrency: int) -> list[dict[str, float | str]]:
    return list(await asyncio.wait_for(asyncio.gather(*(_one(client, model) for _ in range(concurrency))), GUARD))


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered) * 1000, 2), "p95_ms": round(p95 * 1000, 2),
            "n": len(ordered)}


async def _measure(client: Any, model: str, concurrency: int, rounds: int, fake_url: str,
                   ) -> dict[str, dict[str, float]]:
    import httpx  # noqa: PLC0415 - with the clients

    await _round(client, model, min(concurrency, 4))  # warm-up: connections, imports, the first instance
    results: list[dict[str, float | str]] = []
    for _ in range(rounds):
        results += await _round(client, model, concurrency)
    async with httpx.AsyncClient() as http:
        seen = (await http.get(f"{fake_url}/stats")).json()
    added = [float(r["first_chunk"]) - seen[str(r["key"])]["first_token"] for r in results]
    start = [seen[str(r["key"])]["arrived"] - float(r["sent"]) for r in results]
    ttft = [float(r["first_chunk"]) - float(r["sent"]) for r in results]
    return {"added": _stats(added), "start": _stats(start), "ttft": _stats(ttft)}


def _assembly(root: Path, fake_url: str) -> Path:
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "talker.yaml").write_text("name: talker\nmodel: fake:fake-1\n")
    assembly = root / "loopwright.yaml"
    assembly.write_text(f"store: {{kind: file, path: ./store}}\n"
                        f'providers: {{fake: {{kind: openai, baseUrl: "{fake_url}/v1", apiKey: bench-key}}}}\n'
                        "agentDefinitions: {talker: agents/talker.yaml}\n"
                        "server: {maxEventStreams: 4096, maxConnections: 4096}\n")
    return assembly


@contextlib.contextmanager
def _process(argv: list[str], cwd: Path, pattern: str, name: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=(cwd / f"{name}.log").open("w"), text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(pattern, line)
        if match is None:
            raise RuntimeError(f"{argv[:4]} printed {line!r}; see the logs in {cwd}")
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import httpx  # noqa: PLC0415
    import openai  # noqa: PLC0415 - only when measuring

    root = Path(tempfile.mkdtemp(prefix="ttft-"))
    fake_argv = [sys.executable, str(SELF), "--fake", "--first-ms", str(args.first_ms),
                 "--gap-ms", str(args.gap_ms), "--tokens", str(args.tokens)]
    out: dict[str, Any] = {"first_ms": args.first_ms, "gap_ms": args.gap_ms, "tokens": args.tokens, "runs": []}
    with _process(fake_argv, root, r"PORT (\d+)", "fake") as port:
        fake_url = f"http://127.0.0.1:{port}"
        profile = ["-m", "cProfile", "-o", str(args.profile.resolve())] if args.profile else []
        serve_argv = [sys.executable, *profile, "-m", "loopwright.cli", "serve", "-c", str(_assembly(root, fake_url)),
                      "--port", "0"]
        with _process(serve_argv, root, r"listening on (http://\S+)", "serve") as serve_url:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
            # No Nagle on the client's sockets: a request's head and body go at once, as a browser's do.
            nodelay = httpx.AsyncHTTPTransport(limits=limits, socket_options=[
                (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
            async with httpx.AsyncClient(transport=nodelay, timeout=GUARD) as http:
                for _ in range(600):  # until /healthz answers
                    with contextlib.suppress(httpx.TransportError):
                        if (await http.get(f"{serve_url}/healthz")).status_code == 200:
                            break
                    await asyncio.sleep(0.05)
                direct = openai.AsyncOpenAI(base_url=f"{fake_url}/v1", api_key="bench", http_client=http,
                                            max_retries=0)
                served = openai.AsyncOpenAI(base_url=f"{serve_url}/openai/v1", api_key="bench", http_client=http,
                                            max_retries=0)
                for concurrency in args.concurrency:
                    rounds = args.many_rounds if concurrency > 1 else args.rounds
                    row = {"concurrency": concurrency, "streams": rounds * concurrency,
                           "direct": await _measure(direct, "fake-1", concurrency, rounds, fake_url),
                           "loopwright": await _measure(served, "loopwright/talker", concurrency, rounds, fake_url)}
                    base = row["direct"]["added"]["median_ms"]
                    row["added_by_loopwright_ms"] = {
                        "median": round(row["loopwright"]["added"]["median_ms"] - base, 2),
                        "p95": round(row["loopwright"]["added"]["p95_ms"] - base, 2)}
                    out["runs"].append(row)
                    print(_line(row), file=sys.stderr, flush=True)
    return out


def _line(row: dict[str, Any]) -> str:
    d, lw, add = row["direct"], row["loopwright"], row["added_by_loopwright_ms"]
    return (f"{row['concurrency']:>4} streams x{row['streams']}: first token -> first chunk: direct "
            f"{d['added']['median_ms']} ms (p95 {d['added']['p95_ms']}), loopwright {lw['added']['median_ms']} ms "
            f"(p95 {lw['added']['p95_ms']}); added by loopwright: median {add['median']} ms, p95 {add['p95']} ms; "
            f"request -> model request: direct {d['start']['median_ms']} ms, loopwright {lw['start']['median_ms']} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 100], help="concurrent streams")
    ap.add_argument("--rounds", type=int, default=40, help="streams measured one at a time (concurrency 1)")
    ap.add_argument("--many-rounds", type=int, default=3,
                    help="rounds of C streams at once measured at each concurrency C above 1")
    ap.add_argument("--first-ms", type=float, default=20.0, help="the fake model's time to its first token")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="time between the fake model's tokens")
    ap.add_argument("--tokens", type=int, default=16, help="tokens after the first")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run the server under cProfile and write its profile here (read it with pstats)")
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fake:
        asyncio.run(_serve_fake(args.first_ms, args.gap_ms, args.tokens))
        return
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
