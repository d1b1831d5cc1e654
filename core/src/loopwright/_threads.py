"""Threads: conversations a caller names and comes back to (seed 002's ``agent.thread(id).send(input)``).

A thread is an instance whose id the caller chose. :meth:`Thread.send` starts it with the text as
its prompt the first time, and later sends the text to it as a message, so the model sees every
message of the thread before it. One segment runs at a time per thread: a send while it runs is
read at the thread's next turn boundary (as any message is), and a send while it waits for
approval is read once the held calls are decided. Limits (``maxIterations``, budgets) count per
segment: each message to a resting thread starts one (one read while it runs counts in that one).
A thread id follows the instance id rule
(:data:`~loopwright.INSTANCE_ID_RULE`); deleting the thread (:meth:`~loopwright.Runtime.delete`)
deletes its data.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import attrs

from loopwright._ids import INSTANCE_ID_RULE, is_instance_id
from loopwright._lease import held_lease
from loopwright.errors import ConfigError, InstanceNotFoundError, LoopwrightError, StoreError

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from loopwright._definition import Capabilities, Definition
    from loopwright._run import AgentRun, LiveRuns
    from loopwright._runtime import Runtime
    from loopwright.abc import Store

__all__ = ["Thread", "delete_tree"]


@attrs.frozen
class Thread:
    """A named conversation with one definition: :meth:`Runtime.thread <loopwright.Runtime.thread>`.

    Attributes:
        runtime: The open runtime it runs in.
        thread_id: Its id, which is the instance's id.
        definition: What :meth:`~loopwright.Runtime.start_agent` takes: a registered name, a
            file, a mapping or a :class:`~loopwright.Definition`.
    """

    runtime: Runtime
    thread_id: str
    definition: str | os.PathLike[str] | Definition | Mapping[str, Any]

    def __attrs_post_init__(self) -> None:
        if not is_instance_id(self.thread_id):
            raise ConfigError(f"invalid thread id {self.thread_id!r}: use {INSTANCE_ID_RULE}")

    async def send(self, text: str, *, inputs: Mapping[str, Any] | None = None,
                   capabilities: Capabilities | None = None, stream: bool = False) -> AgentRun:
        """Send ``text``: start the thread with it as the prompt, or send it to the thread as a message.

        :param inputs: The definition's inputs, used when the thread starts (later sends ignore them).
        :param capabilities: Grants to ask for when the thread starts (narrowed to the runtime's).
        :param stream: Ask providers to stream.
        :return: The thread's run; ``await run.result()`` waits until it rests again.
        :raises ConfigError: The definition is invalid, or the thread exists as an instance of
            another definition.
        """
        rt = self.runtime
        try:
            run = await rt.get_agent(self.thread_id)
        except InstanceNotFoundError:
            try:
                return await rt.start_agent(self.definition, inputs, text, capabilities=capabilities,
                                            stream=stream, instance_id=self.thread_id)
            except StoreError as exc:
                if isinstance(exc, InstanceNotFoundError):
                    raise
                # Another send created it meanwhile (the store refused the second create): join it.
                try:
                    run = await rt.get_agent(self.thread_id)
                except InstanceNotFoundError:
                    raise exc from None
        self._same_definition(run)
        run.stream = stream
        return await rt.message(self.thread_id, text, source="user")

    async def delete(self) -> None:
        """Delete the thread and everything stored of it (:meth:`Runtime.delete <loopwright.Runtime.delete>`)."""
        await self.runtime.delete(self.thread_id)

    def _same_definition(self, run: AgentRun) -> None:
        wanted = self.runtime.load_definition(self.definition).name
        saved = run.inst.header.definition or {}
        name = saved.get("name") if isinstance(saved, dict) else None
        if name is not None and name != wanted:
            raise ConfigError(f"thread {self.thread_id!r} is an instance of {name!r}, not {wanted!r}: "
                              "a thread keeps the definition it started with")


async def delete_tree(store: Store, live: LiveRuns, owner: str, instance_id: str) -> list[str]:
    """Delete the root ``instance_id`` and every instance below it, and everything the store keeps of them.

    Every instance of the tree is leased first (so none runs anywhere while it goes); then each
    is deleted, children before their spawner, and dropped from what this runtime holds.
    Records already sent to record sinks other than the store stay where they went.

    :return: The ids deleted, in the order they were.
    :raises InstanceNotFoundError: There is no such instance.
    :raises LoopwrightError: It is not a root (delete its root instead).
    :raises LoopwrightError: It or one of its descendants runs in this process (cancel it first).
    :raises InstanceLockedError: It or one of its descendants runs in another process; nothing is deleted.
    :raises StoreError: The store cannot delete (its plugin does not implement
        :meth:`~loopwright.abc.Store.delete`), or failed part-way (what is left stays loadable:
        a spawner goes after its children).
    """
    header = await store.read_header(instance_id)
    spawner = header.get("spawnerInstanceId")
    if spawner:
        raise LoopwrightError(f"instance {instance_id} was started by {spawner}: delete the root of its tree "
                              "(a child goes with it)")
    order: list[str] = []
    pending = [instance_id]
    while pending:
        current = pending.pop()
        if current in order:
            continue
        order.append(current)
        if current != instance_id:
            try:
                header = await store.read_header(current)
            except InstanceNotFoundError:
                order.pop()  # a child whose creation never finished
                continue
        children = header.get("children")
        pending.extend(c for c in (children if isinstance(children, list) else []) if isinstance(c, str))
    for current in order:
        run = live.run(current)
        if run is not None and run.running:
            raise LoopwrightError(f"instance {current} is running in this process: cancel it (loopwright cancel "
                                  f"{current}) before deleting its tree")
    async with contextlib.AsyncExitStack() as leases:
        for current in order:
            await leases.enter_async_context(held_lease(store, current, owner))
        for current in reversed(order):  # children before their spawner
            await store.delete(current)
            live.forget(current)
    return list(reversed(order))
