"""Leave work for the workers: post a message to every resting instance, run nothing here.

    python post.py TEXT

A host (a web app, a cron job) does this with ``Runtime.store.post``: the message lands in the
instance's mailbox in the database, and a ``loopwright worker`` on any machine picks it up at
its next poll and runs the segment. The script then waits, up to a minute, until every instance
has answered (one more model request, and resting again), and prints one line per instance.
"""

import sys
import time
from datetime import UTC, datetime

import anyio

import loopwright

RESTING = {"waiting", "stopped", "error", "waiting_for_approval"}


async def main(text: str) -> None:
    async with loopwright.Runtime.from_file("loopwright.yaml") as rt:
        before = {i["instanceId"]: i["usage"]["requests"] for i in await rt.list_instances(state="waiting")}
        at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        for instance_id in before:
            await rt.store.post(instance_id, {"type": "message", "text": text, "source": "api", "at": at})
        print(f"posted to {len(before)} instances", file=sys.stderr)
        deadline = time.monotonic() + 60
        while True:
            now = {i["instanceId"]: i for i in await rt.list_instances()}
            done = [i for i in before if now[i]["usage"]["requests"] > before[i] and now[i]["state"] in RESTING]
            if len(done) == len(before):
                break
            if time.monotonic() > deadline:
                sys.exit(f"only {len(done)} of {len(before)} instances answered within a minute")
            await anyio.sleep(0.2)
        for instance_id in before:
            print(f"{instance_id}: {now[instance_id]['state']}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
