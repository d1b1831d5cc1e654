"""Loading instances from the store, and keeping the copies in memory current: :class:`Loader`.

A saved instance runs only as saved: its definition from the header's snapshot (or its file; a
definition registered in the assembly is read from the assembly again, never from the row), under
the gates its caller passed down (``inheritedGates``), with its saved grants narrowed to this
runtime's. Under an assembly with an integrity key, a row whose signature does not verify is
refused first (:mod:`loopwright._integrity`). Anything malformed refuses to run it (fails closed), always with an
:class:`~loopwright.errors.UnloadableInstanceError` naming the instance, so a worker can tell a
bad row (which it quarantines) from a store that is out of reach (which it retries). A copy in
memory is read again whenever another process saved the instance since.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loopwright._capabilities import capabilities_from_dict, intersect
from loopwright._definition import gates_from_json, with_gates
from loopwright._header import InstanceHeader
from loopwright._header_fields import HeaderFields
from loopwright._instance import Instance
from loopwright._replay import restore
from loopwright._run import AgentRun
from loopwright.errors import (
    ConfigError,
    GrantsError,
    InstanceLockedError,
    InstanceNotFoundError,
    LeaseLostError,
    StoreError,
    StoreUnavailableError,
    UnloadableInstanceError,
)

if TYPE_CHECKING:
    from loopwright._definition import Capabilities, Definition
    from loopwright._runtime import Runtime

__all__ = ["Loader"]

#: Store errors that say nothing about the row itself (no such instance, a lease, the store out of reach).
_NOT_THE_ROW = (InstanceNotFoundError, InstanceLockedError, LeaseLostError, StoreUnavailableError)


class Loader:
    """The instances of one runtime as the store holds them: loading, reloading, their definitions and grants."""

    def __init__(self, runtime: Runtime) -> None:
        """Load instances through ``runtime`` (its store, assembly and live runs)."""
        self._rt = runtime

    async def load_run(self, instance_id: str) -> AgentRun:
        """Return the run of an instance, loading it from the store if it is not live here (see ``get_agent``)."""
        rt = self._rt
        run = rt.live.run(instance_id)
        if run is not None:
            return run
        inst = rt.live.instance(instance_id)  # a spawner whose run was let go: the same ledger
        if inst is not None:
            run = AgentRun(rt, inst)
            await self.refresh(run)  # as loading would: what another process saved since wins
            rt.live.add(run)
            return run
        header = await rt.store.read_header(instance_id)
        self.check_signature(instance_id, header)
        try:
            defn = self.definition_from_header(instance_id, header)
            grants = self.saved_grants(instance_id, header)
            inst = Instance(id=instance_id, definition=defn, header=HeaderFields(header), grants=grants)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a header of the wrong shape
            raise UnloadableInstanceError(f"its saved header is malformed ({type(exc).__name__}: {exc}); "
                                          "refusing to run it", instance_id=instance_id) from exc
        await self._restore(inst)
        run = AgentRun(rt, inst)
        rt.live.add(run)
        if inst.header.monitors and rt.monitors is not None:
            rt.monitors.load(header)
        return run

    async def refresh(self, run: AgentRun) -> None:
        """Reload the instance if another process changed it since this copy was read."""
        header = await self._rt.store.read_header(run.instance_id)
        if HeaderFields(header).updated_at == run.inst.header.updated_at and not run.stale:
            return
        inst = run.inst
        self.check_signature(run.instance_id, header)
        await self._restore(inst)  # replaces nothing if the log cannot be read
        inst.header = HeaderFields(header)
        inst.grants = self.saved_grants(run.instance_id, header)
        run.stale = False

    async def _restore(self, inst: Instance) -> None:
        """Replay ``inst``'s entry log from the store.

        :raises UnloadableInstanceError: The log cannot be replayed (a line of the wrong shape).
        """
        try:
            await restore(inst, self._rt.store)
        except _NOT_THE_ROW:
            raise
        except UnloadableInstanceError:
            raise
        except (StoreError, ValueError, TypeError, KeyError, AttributeError) as exc:
            reason = exc.args[0] if isinstance(exc, StoreError) and exc.args else f"{type(exc).__name__}: {exc}"
            raise UnloadableInstanceError(f"its entry log cannot be replayed ({reason}); refusing to run it",
                                          instance_id=inst.id) from exc

    def check_signature(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Check the row's signature, when this runtime's assembly names an integrity key.

        :raises RowIntegrityError: The row is not signed, or its signature does not verify.
        """
        if self._rt.signer is not None:
            self._rt.signer.check(instance_id, header)

    def definition_from_header(self, instance_id: str, header: dict[str, Any]) -> Definition:
        """Return the definition a saved header runs, under its inherited gates.

        That is the assembly's definition of its ``registeredDefinition`` name, read again now;
        else its snapshot; else its file.

        :raises UnloadableInstanceError: The header holds no valid definition, or names a
            registered definition this assembly does not register (or cannot read).
        :raises GrantsError: Its inherited gates are missing or malformed (fails closed).
        """
        saved = InstanceHeader.from_json(header, lenient=True)  # as saved: the checks below judge it
        snapshot = saved.definition
        if saved.registered_definition is not None:
            defn = self._registered(instance_id, saved.registered_definition)
        elif isinstance(snapshot, Mapping):
            from loopwright._config import definition_from_dict  # noqa: PLC0415 - the loader only to resume a saved definition

            try:
                defn = definition_from_dict(snapshot)
            except ConfigError as exc:
                raise UnloadableInstanceError(f"saved definition is invalid: {exc}", instance_id=instance_id) from exc
        elif saved.definition_path:
            try:
                defn = self._rt.load_definition(saved.definition_path)
            except ConfigError as exc:
                raise UnloadableInstanceError(f"its definition file cannot be loaded: {exc}",
                                              instance_id=instance_id) from exc
        else:
            raise UnloadableInstanceError("the header holds no definition", instance_id=instance_id)
        # Absent, as opposed to saved null (malformed: refused below).
        if not HeaderFields(header).has("inherited_gates"):
            if saved.spawner_instance_id:
                raise GrantsError("it was started by an agent but its header has no inheritedGates (its caller's "
                                  "gates); refusing to run it", instance_id=instance_id)
            return defn
        # The caller's gates, saved at spawn: applied again, so the child never runs without them.
        try:
            return with_gates(defn, gates_from_json(saved.inherited_gates))
        except ValueError as exc:
            raise GrantsError(f"saved inheritedGates are malformed ({exc}); refusing to run it",
                              instance_id=instance_id) from exc

    def _registered(self, instance_id: str, name: object) -> Definition:
        """Return the definition the assembly registers as ``name``, read again (never the row's snapshot)."""
        registered = self._rt.assembly.agent_definitions
        if not isinstance(name, str) or name not in registered:
            known = ", ".join(sorted(registered)) or "none"
            raise UnloadableInstanceError(
                f"it was started from the registered definition {name!r}, which this assembly does not "
                f"register (agentDefinitions: {known}); refusing to run it", instance_id=instance_id)
        try:
            return self._rt.load_definition(name)
        except ConfigError as exc:
            raise UnloadableInstanceError(f"its registered definition {name!r} cannot be loaded: {exc}",
                                          instance_id=instance_id) from exc

    def saved_grants(self, instance_id: str, header: dict[str, Any]) -> Capabilities:
        """Return the saved grants intersected with this runtime's; fail closed on a bad marker."""
        recorded = InstanceHeader.from_json(header, lenient=True)  # as saved: the checks below judge it
        if recorded.capabilities_recorded:
            try:
                saved = capabilities_from_dict(recorded.capabilities)
            except ValueError as exc:
                raise GrantsError(f"saved grants are marked recorded but are not valid ({exc}); "
                                  "refusing to run it", instance_id=instance_id) from exc
            return intersect(self._rt.assembly.capabilities, saved)
        if HeaderFields(header).has("capabilities"):  # present at all (always written: only the saved JSON tells)
            raise GrantsError("saved grants have no capabilitiesRecorded marker; refusing to run it",
                              instance_id=instance_id)
        if self._rt.signer is not None:  # signed rows always record their grants: the old rule is not for them
            raise GrantsError("its row records no grants, and this assembly signs rows (integrity.keyEnv): "
                              "the rule that gives such a row the runtime's grants does not apply; "
                              "refusing to run it", instance_id=instance_id)
        return self._rt.assembly.capabilities
