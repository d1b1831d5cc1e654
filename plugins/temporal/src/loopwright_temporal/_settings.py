"""The Temporal engine's options (``engine: {kind: temporal, ...}``): :class:`TemporalSettings`.

Imports nothing heavy: the schema is read whenever the plugin registers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from loopwright import parse_duration
from loopwright.errors import ConfigError
from loopwright.options import DURATION, options_schema

__all__ = ["SCHEMA", "TemporalSettings"]

#: The options of ``engine: {kind: temporal}``, checked by the loader at their place in the assembly.
SCHEMA: dict[str, Any] = options_schema({
    "address": {"type": "string", "minLength": 1},
    "addressEnv": {"type": "string", "minLength": 1},
    "namespace": {"type": "string", "minLength": 1},
    "taskQueue": {"type": "string", "minLength": 1},
    "heartbeatTimeout": DURATION,
    "segmentTimeout": DURATION,
    "maxConcurrent": {"type": "integer", "minimum": 1},
})

#: Each option's default.
_DEFAULTS: dict[str, Any] = {"address": "localhost:7233", "namespace": "default", "taskQueue": "loopwright",
                             "heartbeatTimeout": 10.0, "segmentTimeout": 86_400.0, "maxConcurrent": 100}


@attrs.frozen(kw_only=True)
class TemporalSettings:
    """Where the Temporal cluster is and how the workflows use it.

    Attributes:
        address: The frontend's ``host:port`` (``addressEnv`` names a variable holding it).
        namespace: The Temporal namespace.
        task_queue: The task queue the workflows and activities run on; every worker of the
            deployment polls it.
        heartbeat_timeout: Seconds without a heartbeat after which a worker is taken for dead
            and its activity is retried on another worker.
        segment_timeout: The most one segment may take (the activity's start-to-close timeout).
        max_concurrent: The most segments one worker runs at once.
    """

    address: str = _DEFAULTS["address"]
    namespace: str = _DEFAULTS["namespace"]
    task_queue: str = _DEFAULTS["taskQueue"]
    heartbeat_timeout: float = _DEFAULTS["heartbeatTimeout"]
    segment_timeout: float = _DEFAULTS["segmentTimeout"]
    max_concurrent: int = _DEFAULTS["maxConcurrent"]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> TemporalSettings:
        """Read the engine's options (already checked against :data:`SCHEMA`).

        :raises ConfigError: ``addressEnv`` names an unset variable, or a duration is not positive.
        """
        opts = {**_DEFAULTS, **options}
        address = opts["address"]
        env = options.get("addressEnv")
        if env:
            address = os.environ.get(str(env))
            if not address:
                raise ConfigError(f"engine: addressEnv names {env}, which is not set")
        heartbeat, segment = parse_duration(opts["heartbeatTimeout"]), parse_duration(opts["segmentTimeout"])
        if heartbeat <= 0 or segment <= 0:
            raise ConfigError("engine: heartbeatTimeout and segmentTimeout must be more than 0 s")
        return cls(address=str(address), namespace=str(opts["namespace"]), task_queue=str(opts["taskQueue"]),
                   heartbeat_timeout=heartbeat, segment_timeout=segment, max_concurrent=int(opts["maxConcurrent"]))
