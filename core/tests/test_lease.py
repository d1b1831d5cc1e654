"""held_lease: the one acquire/release of an instance's runner lease, with hand-over to a segment."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from loopwright._lease import held_lease
from loopwright.abc import StoreSettings
from loopwright.builtins.file_store import FileStore
from loopwright.errors import InstanceLockedError

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path):
    s = FileStore(StoreSettings(kind="file", base_dir=tmp_path, options={}))
    await s.create("i", {})
    yield s
    await s.aclose()


async def free(store: FileStore) -> bool:
    """Return whether another runner can take the lease now (and give it back)."""
    try:
        lease = await store.acquire("i", "other")
    except InstanceLockedError:
        return False
    lease.release()
    return True


async def test_released_when_the_block_ends(store: FileStore) -> None:
    """The lease is held inside the block and released after it."""
    async with held_lease(store, "i", "me") as held:
        assert held.instance_id == "i"
        assert not await free(store)
    assert await free(store)


async def test_released_when_the_block_raises_or_is_cancelled(store: FileStore) -> None:
    """An exception or a cancellation inside the block releases the lease and propagates."""
    with pytest.raises(ValueError, match="boom"):
        async with held_lease(store, "i", "me"):
            raise ValueError("boom")
    assert await free(store)
    with anyio.move_on_after(0.01):
        async with held_lease(store, "i", "me"):
            await anyio.sleep_forever()
    assert await free(store)


async def test_a_handed_over_lease_stays_held_by_its_new_owner(store: FileStore) -> None:
    """After hand_over the block leaves the lease alone; the new owner releases it, and only once may it be handed."""
    async with held_lease(store, "i", "me") as held:
        lease = held.hand_over()
        with pytest.raises(RuntimeError, match="handed over already"):
            held.hand_over()
    assert not await free(store)
    lease.release()
    assert await free(store)


async def test_a_busy_instance_raises_or_yields_none_with_if_free(store: FileStore) -> None:
    """Another runner's lease raises InstanceLockedError, or gives None with if_free."""
    other = await store.acquire("i", "other")
    try:
        with pytest.raises(InstanceLockedError):
            async with held_lease(store, "i", "me"):
                pytest.fail("the block must not run")
        async with held_lease(store, "i", "me", if_free=True) as held:
            assert held is None
    finally:
        other.release()
    async with held_lease(store, "i", "me", if_free=True) as held:
        assert held is not None


async def test_if_free_does_not_swallow_a_lock_error_from_the_block(store: FileStore) -> None:
    """With if_free, only the acquire is guarded: InstanceLockedError raised in the block propagates."""
    with pytest.raises(InstanceLockedError):
        async with held_lease(store, "i", "me", if_free=True):
            raise InstanceLockedError("j")
    assert await free(store)
