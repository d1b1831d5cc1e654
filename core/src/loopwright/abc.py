"""The interfaces plugins implement: providers, stores, engines, context strategies and record sinks.

Each is an abstract class with one or a few async methods that raise ``NotImplementedError``,
plus ``aclose()`` and the async context manager protocol. A plugin registers a *factory* for its
kind through the matching ``loopwright_register_*`` hook; the runtime builds instances from the
assembly's settings and closes them when it closes.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import attrs

from loopwright._header_fields import HeaderFields
from loopwright._states import State
from loopwright.errors import StoreError

if TYPE_CHECKING:
    from types import TracebackType

    from loopwright._types import Message, ModelRequest, ModelResponse, Record, StreamDelta, Usage

__all__ = [
    "CompactionContext",
    "ContextStrategy",
    "Engine",
    "Lease",
    "Provider",
    "ProviderSettings",
    "RecordSink",
    "Store",
    "StoreSettings",
    "new_post_id",
]


class _AsyncClosing:
    async def aclose(self) -> None:
        """Release what the object holds. Called once, when the runtime closes."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@attrs.frozen(kw_only=True)
class ProviderSettings:
    """How the assembly configures one provider.

    Attributes:
        name: The provider's name in the assembly (``providers: {NAME: ...}``), or its kind when
            a model reference names a kind directly.
        kind: The registered provider kind.
        base_url: The API's base URL, when set.
        api_key: The API key, resolved from ``apiKey`` or ``apiKeyEnv``.
        options: Every other key of the provider's YAML mapping, camelCase as written.
        http_client: An ``httpx.AsyncClient`` to use instead of building one (tests inject one
            with ``httpx.MockTransport``).
        base_dir: The folder relative paths in ``options`` are taken from (the assembly's folder).
    """

    name: str
    kind: str
    base_url: str | None = None
    api_key: str | None = None
    options: Mapping[str, Any] = attrs.field(factory=dict)
    http_client: Any = None
    base_dir: Path = attrs.field(factory=Path.cwd)


class Provider(_AsyncClosing, abc.ABC):
    """A model API.

    Subclasses implement :meth:`complete`. A provider is built once per runtime from
    :class:`ProviderSettings` and serves every model of its kind, concurrently: keep per-call
    state on the stack, not on ``self``.

    Usage::

        class EchoProvider(Provider):
            def __init__(self, settings: ProviderSettings) -> None:
                self.settings = settings

            async def complete(self, request: ModelRequest) -> ModelResponse:
                last = request.messages[-1].content or ""
                return ModelResponse(message=Message(role="assistant", content=last))

        @loopwright.hookimpl
        def loopwright_register_providers(register):
            register("echo", EchoProvider)
    """

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request and return the answer.

        Raise :class:`~loopwright.errors.ProviderError` on failure, with ``transient=True`` for
        failures a retry may fix (408, 429, 5xx, timeouts, connection resets). Retrying those
        (honouring ``retry_after``) is the provider's job; :func:`loopwright.retry_transient`
        does it. Never raise for a malformed answer the model gave: put what can be read in the
        message (unparseable tool arguments go in ``ToolCall.raw_arguments``).
        """
        raise NotImplementedError

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamDelta]:
        """Send one request and yield the answer as it arrives, ending with a ``done`` delta.

        The ``done`` delta carries the whole :class:`~loopwright.ModelResponse`, reassembled
        from the pieces (tool-call arguments joined and parsed), so the loop never has to.
        A stream that breaks off raises :class:`~loopwright.errors.ProviderError` (transient
        when retrying may help). The default calls :meth:`complete` and yields its text as one
        piece; providers that can stream override it.
        """
        from loopwright._types import StreamDelta  # noqa: PLC0415 - keeps this module import-light

        response = await self.complete(request)
        if response.message.content:
            yield StreamDelta(kind="text", text=response.message.content)
        for call in response.message.tool_calls:
            yield StreamDelta(kind="tool_call", tool_call_id=call.id, name=call.name)
        yield StreamDelta(kind="done", response=response)


@attrs.frozen(kw_only=True)
class StoreSettings:
    """How the assembly configures the store.

    Attributes:
        kind: The registered store kind.
        base_dir: The folder relative paths are resolved against (the assembly's folder).
        options: Every other key of ``store:``, camelCase as written.
    """

    kind: str
    base_dir: Path
    options: Mapping[str, Any] = attrs.field(factory=dict)


def new_post_id() -> str:
    """Return a fresh id for a mailbox post (:meth:`Store.post`): 32 random hexadecimal digits.

    .. versionadded:: 0.2
    """
    import secrets  # noqa: PLC0415 - secrets (hmac, hashlib: ~5 ms) only when a post is made, not for ls (issue 30)

    return secrets.token_hex(16)


class Store(_AsyncClosing, abc.ABC):
    """Where instances live between and across processes.

    An instance is a *header* (a JSON object, rewritten whole and atomically), an append-only
    *entry log* (its transcript and turn bookkeeping) and an append-only *record log*. Every
    value is a JSON-ready ``dict``; the runtime owns their meaning. Appending must cost the same
    whatever the log's length.
    """

    @abc.abstractmethod
    async def create(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Create an instance. Raise :class:`~loopwright.errors.StoreError` if the id exists."""
        raise NotImplementedError

    @abc.abstractmethod
    async def write_header(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Replace the header atomically: a reader sees the old one or the new one, never a mix."""
        raise NotImplementedError

    @abc.abstractmethod
    async def read_header(self, instance_id: str) -> dict[str, Any]:
        """Return the header. Raise :class:`~loopwright.errors.InstanceNotFoundError` if absent."""
        raise NotImplementedError

    @abc.abstractmethod
    async def append_entries(self, instance_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append to the entry log; when this returns, a new process can read them."""
        raise NotImplementedError

    @abc.abstractmethod
    async def read_entries(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole entry log in order. A torn last line (a crash mid-write) is dropped."""
        raise NotImplementedError

    @abc.abstractmethod
    async def append_records(self, instance_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Append to the record log."""
        raise NotImplementedError

    @abc.abstractmethod
    async def read_records(self, instance_id: str) -> list[dict[str, Any]]:
        """Return the whole record log in order."""
        raise NotImplementedError

    @abc.abstractmethod
    async def list_headers(self) -> list[dict[str, Any]]:
        """Return every instance's header, oldest first."""
        raise NotImplementedError

    async def read_resume(self, instance_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Return ``(checkpoint, entries after it)``: what loading an instance needs.

        ``checkpoint`` is the JSON object last given to :meth:`checkpoint`'s ``fold`` (the state
        replayed from a prefix of the entry log), or ``None``; the entries are those after that
        prefix. A store must return ``None`` and the whole log for a checkpoint it cannot verify
        (torn, corrupt, or not a prefix of this log): a checkpoint is a cache of the log, never
        a second truth. The default has no checkpoints: ``(None, await self.read_entries(...))``.
        """
        return None, await self.read_entries(instance_id)

    async def checkpoint(self, instance_id: str,
                         fold: Callable[[Mapping[str, Any] | None, list[dict[str, Any]]], dict[str, Any]],
                         ) -> None:
        """Maybe save a checkpoint of an instance at rest, so that loading it costs O(1) in its log's length.

        A store that keeps checkpoints calls ``fold(checkpoint, entries_after_it)`` when enough
        was appended since its last one, and saves the JSON object it returns atomically as the
        checkpoint of the log up to the last entry given. Only the lease holder calls this.
        The default keeps none.
        """
        del instance_id, fold

    async def delete(self, instance_id: str) -> None:
        """Delete an instance and everything this store keeps of it: header, entries, records, mailbox, checkpoint.

        Only the holder of the instance's lease calls this (:meth:`loopwright.Runtime.delete`
        takes it, for every instance of the tree, first); releasing that lease afterwards must
        not fail. Once it returns, :meth:`read_header` raises
        :class:`~loopwright.errors.InstanceNotFoundError`, :meth:`list_headers` no longer lists
        it, and the id may be created again. A store that leases on a server must delete under
        the same fence as its other writes (nothing is deleted once another runner took over).
        The default raises :class:`~loopwright.errors.StoreError`: a store plugin that cannot
        delete says so, and nothing is deleted.

        :raises InstanceNotFoundError: There is no such instance.

        .. versionadded:: 0.3
        """
        raise StoreError(f"the {type(self).__name__} cannot delete instances", instance_id=instance_id)

    async def create_leased(self, instance_id: str, header: Mapping[str, Any], owner: str) -> Lease:
        """Create an instance (as :meth:`create`) with its runner lease already held by ``owner``.

        The runtime creates an instance it is about to run here this way, so that no worker can
        take the new instance between its creation and its first segment (a worker treats an
        instance left ``running`` whose lease is free as a dead runner's, and resumes it). A
        store that others share must make the two one step: the instance is never visible to
        :meth:`acquire` with its lease free. The default calls :meth:`create`, then
        :meth:`acquire`: enough for a store no worker shares, not for one it does (the file and
        sqlite stores override it).

        :raises StoreError: As :meth:`create`; nothing is left behind.

        .. versionadded:: 0.1
        """
        await self.create(instance_id, header)
        return await self.acquire(instance_id, owner)

    async def acquire(self, instance_id: str, owner: str) -> Lease:
        """Take the instance's runner lease without waiting: one runner per instance.

        Raise :class:`~loopwright.errors.InstanceLockedError` at once if another runner (in
        any process) holds it; a lease whose holder died must be taken over. The default grants
        every request (a store that cannot lock cannot stop two runners); the file store locks
        with ``flock``.

        A store whose leases can be lost while held (a lease on a server that the holder can be
        cut off from) must *fence*: refuse, in the same step as the write, every write of this
        store to the instance once another runner took the lease over, raising
        :class:`~loopwright.errors.LeaseLostError` with nothing written. The runtime ends the
        segment without changing the instance's state then. The postgres store fences.
        """
        del instance_id, owner
        return Lease()

    async def post(self, instance_id: str, item: Mapping[str, Any]) -> None:
        """Append an item to the instance's mailbox (a message or a cancel request).

        Unlike every other write, any process may post while another one runs the instance;
        the runner reads the mailbox with :meth:`read_posts`.

        Posting is idempotent by the item's ``id``, chosen by the poster (:func:`new_post_id`):
        an item whose ``id`` (a non-empty string) the instance's mailbox already holds is not
        added again, and the call returns as if it had been. So a post retried after an error
        that left unknown whether it landed (a connection lost after the commit) lands once.
        Items without an ``id`` are each added. The item comes back from :meth:`read_posts`
        as given, ``id`` included.

        .. versionchanged:: 0.2
           Idempotent by ``id``.
        """
        raise NotImplementedError

    async def read_posts(self, instance_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Return the mailbox items after ``cursor`` and the cursor after them (0 reads from the start).

        Called at every turn boundary, so it must be cheap when nothing is new.
        """
        raise NotImplementedError

    async def find_work(self, *, limit: int) -> list[str]:
        """Return the ids of up to ``limit`` instances that may have work for a worker (``loopwright worker``).

        Candidates, in this order: an instance ``waiting_for_approval`` whose held calls are all
        decided; a resting one (``waiting``, ``stopped``, ``error``) with a message in its
        mailbox after its header's ``inboxCursor``; an instance left ``running`` that some runner
        began (its runner may have died), the least recently updated first; and last the queue:
        instances submitted for any worker (``running`` with ``queued: true`` in the header,
        written by :meth:`loopwright.Runtime.submit`), oldest first. So a dead runner's instances
        go ahead of the queue, and a queued instance is never mistaken for a dead runner's (the
        runtime starts it, it does not resume it). A candidate list is enough: the worker takes
        the lease and checks again under it, so an id whose runner is alive costs one failed
        :meth:`acquire`. Called every poll interval by every worker, so a store shared by many
        should override it with one cheap query (the postgres store does, and leaves out
        instances whose lease is held). The default reads :meth:`list_headers` and, for resting
        instances, :meth:`read_posts`; that suits the file and sqlite stores.

        .. versionadded:: 0.1
        """
        decided: list[str] = []
        mail: list[str] = []
        running: list[tuple[str, str]] = []
        queued: list[str] = []
        for saved in await self.list_headers():
            header = HeaderFields(saved)
            instance_id, state = header.instance_id, header.state
            if not isinstance(instance_id, str):
                continue
            if state is State.RUNNING:
                if header.queued is True:
                    queued.append(instance_id)  # list_headers is oldest first
                else:
                    running.append((str(header.updated_at or ""), instance_id))
            elif state is State.WAITING_FOR_APPROVAL:
                if header.held_calls_decided():
                    decided.append(instance_id)
            elif state in (State.WAITING, State.STOPPED, State.ERROR) and len(decided) + len(mail) < limit:
                cursor = header.inbox_cursor
                try:
                    posts, _ = await self.read_posts(instance_id, cursor if isinstance(cursor, int) else 0)
                except NotImplementedError:
                    return [*decided, *(iid for _at, iid in sorted(running)), *queued][:limit]
                if any(p.get("type") == "message" for p in posts):
                    mail.append(instance_id)
        return [*decided, *mail, *(iid for _at, iid in sorted(running)), *queued][:limit]

    async def wait_for_work(self, timeout: float) -> bool:  # noqa: ASYNC109 - a wait with a bound is the contract
        """Wait up to ``timeout`` seconds for work to be written, for a worker between polls.

        A store that can be told when work is written (the postgres store listens for the
        ``NOTIFY`` of every write that gives an instance work: a new instance, a message or
        cancel, a decision, a lease released while its instance is unfinished) returns as soon
        as such a write happens, or at once if one happened since its previous call, and says
        ``True``. Either way the worker then calls :meth:`find_work`, so waking without work is
        harmless and a missed notification costs at most one poll interval. The default sleeps
        ``timeout`` seconds and returns ``False``: the worker polls.

        .. versionadded:: 0.1
        """
        import anyio  # noqa: PLC0415 - loaded by the runtime anyway; keeps this module's imports light

        await anyio.sleep(timeout)
        return False

    def locations(self) -> Sequence[Path]:
        """Return the folders and files this store keeps data in.

        The runtime refuses to grant any of them to an agent. A store with no local files returns ``()``.
        """
        return ()


class Engine(_AsyncClosing, abc.ABC):
    """Who advances submitted work: the seam between the store (what is to be done) and the runners.

    Every change that gives an instance work is first written to the store: a new instance
    (:meth:`loopwright.Runtime.submit`), a message in its mailbox, a decision on a held call,
    a cancel request, or a dead runner's instance to resume. The store stays the one source
    of truth; the engine only makes sure that some runner picks the work up, through
    :meth:`loopwright.Runtime.pick_up` (which takes the instance's lease, checks again under it
    and starts the segment). An engine is built once per runtime, when it opens, from the
    assembly's ``engine: {kind: NAME, ...options}`` by the factory its plugin registered
    (``loopwright_register_engines``: ``factory(options, runtime)``), and closed when it closes.

    The built-in ``local`` engine leaves the work in the store for ``loopwright worker``
    processes to find (and wakes a worker running in the same process at once).

    Attributes:
        in_process: ``True`` when ``loopwright run`` (without ``--detach``) runs the instance in
            the calling process, as the ``local`` engine does. ``False`` for an engine whose
            runners live elsewhere (a Temporal worker): the plain commands then submit the work
            and follow the instance until it rests.

    Usage::

        class NudgeEngine(Engine):
            in_process = True

            def __init__(self, options, runtime):
                self.runtime = runtime

            async def submit(self, instance_id: str) -> None:
                await tell_my_workers(instance_id)

        @loopwright.hookimpl
        def loopwright_register_engines(register):
            register("nudge", NudgeEngine, options=loopwright.options.options_schema({}))

    .. versionadded:: 0.1
    """

    in_process: ClassVar[bool] = True

    @abc.abstractmethod
    async def submit(self, instance_id: str) -> None:
        """Make some runner advance this instance: the store now holds work for it.

        Called after the work was written (a new instance, a message, a decision, a cancel, a
        resume), by any process. Returns once the work is handed over, not when it is done; a
        runner advances it with :meth:`loopwright.Runtime.pick_up`. Calling it again for work
        already handed over, or for an instance with nothing to do, must be harmless (the
        runner finds nothing and moves on). Raise :class:`~loopwright.errors.LoopwrightError`
        if the work cannot be handed over; the work stays in the store, where a later
        ``submit`` or a worker's poll finds it.
        """
        raise NotImplementedError

    async def run_worker(self, *, poll: float, max_concurrent: int, once: bool, grace: float) -> int | None:
        """Serve this engine's work in this process until stopped (``loopwright worker``); return the exit code.

        An engine whose runners take work from somewhere other than the store's
        :meth:`Store.find_work` (a Temporal task queue) runs its own worker here, advancing each
        instance with :meth:`loopwright.Runtime.pick_up`, and handles SIGTERM and SIGINT as
        ``loopwright worker`` documents (stop taking work, let segments rest for ``grace``
        seconds, exit 0, or 130 after SIGINT). The arguments are the command's options.
        Return ``None`` (the default) to have the command poll the store instead, as for the
        ``local`` engine.

        .. versionadded:: 0.1
        """
        del poll, max_concurrent, once, grace
        return None


class Lease:
    """A held runner lease; :meth:`release` gives it back (twice is harmless).

    Stores that lock subclass it; this base holds nothing. A lease is a context manager that
    releases it on exit.
    """

    def release(self) -> None:
        """Give the lease back."""

    def __enter__(self) -> Self:
        """Return the lease itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


@attrs.define(kw_only=True)
class CompactionContext:
    """What the runtime gives one run of a context strategy (:meth:`ContextStrategy.run`).

    Built by the loop for each run, so a strategy object (shared by every instance of its
    definition) keeps no per-run state of its own.

    Attributes:
        model: The agent's model, ``PROVIDER:MODEL``: what :meth:`summarize` uses by default.
        turn: The model calls the instance has made so far.
        details: Keys the strategy adds to the run's ``compaction`` record (camelCase, JSON-ready).
    """

    model: str
    turn: int
    details: dict[str, Any] = attrs.Factory(dict)
    _summarize: Callable[[Sequence[Message], str, str | None], Awaitable[str]]

    async def summarize(self, messages: Sequence[Message], *, instruction: str, model: str | None = None) -> str:
        """Ask a model for a summary of ``messages``, following ``instruction``; return its text.

        The call goes through the runtime's provider machinery (the provider lookup, its retries
        and the definition's fallback models when ``model`` is not given) and is priced; its
        usage and cost count toward the instance's (and its limits), are saved with the run and
        written in its ``compaction`` record.

        :param messages: The conversation to summarise (sent as text: tool calls and results
            are written out, so no tool needs to be declared).
        :param instruction: What to write, sent as the system prompt of the call.
        :param model: ``PROVIDER:MODEL`` to use instead of the agent's model.
        :raises ~loopwright.errors.ProviderError: The call failed after its retries and
            fallbacks; the loop records it and leaves the transcript as it was.
        """
        return await self._summarize(messages, instruction, model)


class ContextStrategy(abc.ABC):
    """Shrinks a transcript before a model call when it grows too large.

    Attributes:
        kind: The registered kind, for records.
        context_management: What every model request asks the provider to do about the
            context itself (``ModelRequest.context_management``), or ``None``; set by strategies
            the provider carries out (``providerNative``).
    """

    kind: str = "?"
    context_management: Mapping[str, Any] | None = None

    @abc.abstractmethod
    def should_apply(
        self, messages: Sequence[Message], *, last_usage: Usage | None, context_window: int | None,
    ) -> bool:
        """Return whether to run before the next model call (the trigger).

        :param last_usage: The instance's latest model call, whose ``input_tokens`` is how
            full the context really is; ``None`` before any call and right after a compaction
            (estimate from ``messages`` then).
        :param context_window: The model's context window when the runtime knows it, else ``None``.
        """
        raise NotImplementedError

    @abc.abstractmethod
    async def apply(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the messages to keep instead. The system prompt must stay first."""
        raise NotImplementedError

    async def run(self, messages: Sequence[Message], context: CompactionContext) -> Sequence[Message]:
        """Return the messages to keep instead; the loop calls this when the trigger holds.

        The default returns :meth:`apply`. Override it to ask a model for a summary
        (``context.summarize``) or to add keys to the ``compaction`` record (``context.details``).
        """
        del context
        return await self.apply(messages)


class RecordSink(_AsyncClosing, abc.ABC):
    """Receives every record, for example to ship it to a log service."""

    def locations(self) -> Sequence[Path]:
        """Return the files and folders this sink writes to.

        The store's rule holds for them: the runtime refuses to open (``CapabilityError``) when
        any of them lies within a granted file root (read or write) or contains one, and refuses
        to start an instance whose grants would reach one. A sink that writes no local file
        returns ``()`` (the default).
        """
        return ()

    @abc.abstractmethod
    async def write(self, record: Record) -> None:
        """Take one record. Exceptions are caught, recorded and the run goes on (fail open)."""
        raise NotImplementedError
