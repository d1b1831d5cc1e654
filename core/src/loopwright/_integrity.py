"""Row integrity: what a runtime saves of an instance's grants, gates and definition, signed.

Whoever can write the store can edit a saved row. Without a key, the rows are trusted as saved
(docs/security.md says what that allows). With ``integrity: {keyEnv: NAME}`` in the assembly, the
runtime reads a key from the environment variable ``NAME`` when it opens (never from a file, never
saved) and:

- signs each new row (a created, submitted, spawned or forked instance) with an HMAC-SHA256 over
  :data:`SEALED_KEYS`, the header keys that decide what may run and under which rights: the
  definition (its snapshot, its file, the registered name), the grants, the gates a caller passed
  down, the tree budget and depth, and who started it. The signature is saved in the header as
  ``rowSignature``;
- refuses, fail-closed, every row whose signature is missing or does not verify, with
  :class:`~loopwright.errors.RowIntegrityError` (an unloadable instance: a worker quarantines it).

What is signed is the presence and the value of each of those keys, bound to the instance id:
removing a key (``requiresApproval`` from the snapshot, ``inheritedGates``, the grant marker),
changing one, or copying them from another instance's row breaks the signature. The transcript,
the mailbox, the state and the decisions on held calls are not signed (they change at every turn,
from other processes too); docs/security.md states that limit.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

import attrs

from loopwright.errors import RowIntegrityError

__all__ = ["MIN_KEY_LENGTH", "SEALED_KEYS", "SIGNATURE_KEY", "RowSigner", "row_signer_from_env"]

#: The header keys a row's signature covers, in the order they are listed (the signed bytes sort them).
SEALED_KEYS: tuple[str, ...] = (
    "instanceId", "definition", "definitionPath", "registeredDefinition", "capabilities",
    "capabilitiesRecorded", "inheritedGates", "budget", "depth", "spawnerInstanceId", "forkedFrom",
)
#: Where the header keeps its signature.
SIGNATURE_KEY = "rowSignature"
#: The shortest key accepted, in characters.
MIN_KEY_LENGTH = 32
#: The prefix of a signature: its algorithm and the version of the signed bytes.
_SCHEME = "hmac-sha256:v1:"


def _signed_bytes(header: Mapping[str, Any]) -> bytes:
    """Return the canonical JSON of the sealed keys ``header`` holds (an absent key is absent, a null is null)."""
    sealed = {key: header[key] for key in SEALED_KEYS if key in header}
    return json.dumps(sealed, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


@attrs.frozen
class RowSigner:
    """Signs new rows and checks saved ones with one key.

    Attributes:
        key_env: The environment variable the key was read from (named in errors; the key never is).
    """

    key_env: str
    _key: bytes = attrs.field(repr=False, alias="key")

    def signature(self, header: Mapping[str, Any]) -> str:
        """Return the signature of ``header``'s sealed keys (``hmac-sha256:v1:<hex>``)."""
        return _SCHEME + hmac.new(self._key, _signed_bytes(header), hashlib.sha256).hexdigest()

    def sign(self, header: dict[str, Any]) -> None:
        """Save the signature of ``header``'s sealed keys in ``header`` itself (as ``rowSignature``)."""
        header[SIGNATURE_KEY] = self.signature(header)

    def check(self, instance_id: str, header: Mapping[str, Any]) -> None:
        """Check that ``header`` carries the signature of its sealed keys, made with this key.

        :raises RowIntegrityError: It carries none, or one that does not verify (fails closed).
        """
        saved = header.get(SIGNATURE_KEY)
        if not isinstance(saved, str) or not saved:
            raise RowIntegrityError(
                f"its row is not signed, and this assembly requires signed rows (integrity.keyEnv "
                f"{self.key_env}); refusing to run it", instance_id=instance_id)
        try:
            wanted = self.signature(header)
        except (TypeError, ValueError) as exc:  # a sealed value JSON cannot hold (NaN, a non-string key)
            raise RowIntegrityError(f"its signed keys cannot be read ({exc}); refusing to run it",
                                    instance_id=instance_id) from exc
        if not hmac.compare_digest(saved.encode("utf-8", "replace"), wanted.encode("utf-8")):
            raise RowIntegrityError(
                "its row's signature does not verify: its definition, grants or gates were changed "
                f"since it was signed, or it was signed with another key than {self.key_env}'s; "
                "refusing to run it", instance_id=instance_id)


def row_signer_from_env(key_env: str, environ: Mapping[str, str]) -> RowSigner:
    """Return the signer whose key is ``environ[key_env]``.

    :raises ValueError: The variable is unset, or shorter than :data:`MIN_KEY_LENGTH` characters
        (the message names the variable, never its value).
    """
    key = environ.get(key_env)
    if key is None:
        raise ValueError(f"the environment variable {key_env} (integrity.keyEnv) is not set: "
                         "the rows' integrity key is read from it when the runtime opens")
    if len(key) < MIN_KEY_LENGTH:
        raise ValueError(f"the environment variable {key_env} (integrity.keyEnv) holds {len(key)} characters: "
                         f"an integrity key must have at least {MIN_KEY_LENGTH}")
    return RowSigner(key_env, key=key.encode("utf-8"))
