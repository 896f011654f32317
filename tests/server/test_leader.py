"""Leader election on a coordination.k8s.io Lease, driven through the real kubernetes-asyncio client against the fake
API server (whose resourceVersion conflicts make a lost race visible)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from epp.discovery.kubeclient import api_client
from epp.server.leader import LeaderElectionConfig, LeaderElector, lease_name
from tests.fakekube.server import LEASES, FakeKube
from tests.fakekube.testing import eventually, write_kubeconfig

FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}
# A lease nobody could wait out within a test: a quick handover can only come from the release.
LONG = {"lease_duration": 30.0, "renew_deadline": 20.0, "retry_period": 0.1}
# Waits for a condition are generous (a loaded CI box stalls the loop for seconds); what must be quick is asserted
# against the lease duration.
WAIT = 30.0


@contextlib.asynccontextmanager
async def electors(
    kube: FakeKube, tmp_path: Path, n: int, timing: dict[str, float] = FAST
) -> AsyncIterator[list[tuple[LeaderElector, asyncio.Task[None]]]]:
    kubeconfig = write_kubeconfig(kube, tmp_path)
    apis = [await api_client(kubeconfig) for _ in range(n)]
    out = []
    for i, api in enumerate(apis):
        e = LeaderElector(
            api, LeaderElectionConfig("default", lease_name("default", "pool"), identity=f"epp-{i}", **timing)
        )
        out.append((e, asyncio.create_task(e.run())))
    try:
        yield out
    finally:
        for _, t in out:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for api in apis:
            await api.close()


def holder(kube: FakeKube) -> str:
    (lease,) = kube.objects(LEASES, "default")
    return str(lease["spec"]["holderIdentity"])


async def test_one_leader_and_a_release_hands_over_at_once(kube: FakeKube, tmp_path: Path) -> None:
    async with electors(kube, tmp_path, 3, LONG) as es:
        await eventually(lambda: any(e.is_leader for e, _ in es), WAIT, "a leader")
        await asyncio.sleep(0.5)  # several retry periods: nobody else wins
        leaders = [e for e, _ in es if e.is_leader]
        assert len(leaders) == 1 and holder(kube) == leaders[0].cfg.identity
        assert kube.objects(LEASES, "default")[0]["metadata"]["name"] == "epp-default-pool.llm-d.ai"
        first = leaders[0]
        t0 = time.monotonic()
        for e, t in es:
            if e is first:
                t.cancel()  # possibly in the middle of a renewal: the release must still land
        await first.release()
        assert holder(kube) == "" and not first.is_leader
        await eventually(lambda: any(e.is_leader for e, _ in es if e is not first), WAIT, "a new leader")
        assert time.monotonic() - t0 < 15  # released: no wait for the 30 s lease to expire
        assert kube.objects(LEASES, "default")[0]["spec"]["leaseTransitions"] == 1


async def test_release_after_a_renewal_it_did_not_see_land(kube: FakeKube, tmp_path: Path) -> None:
    """A renewal cancelled after the server applied it leaves the elector one resourceVersion behind; the release
    then conflicts (409), re-reads, and still frees the Lease."""
    async with electors(kube, tmp_path, 1, LONG) as ((e, task),):
        await eventually(lambda: e.is_leader, WAIT, "leader")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stale = e._last
        assert stale is not None
        lease = kube.objects(LEASES, "default")[0]
        lease["spec"]["renewTime"] = "2026-01-01T00:00:00.000000Z"  # what the unseen renewal wrote
        kube.update(LEASES, lease)
        assert kube.objects(LEASES, "default")[0]["metadata"]["resourceVersion"] != stale["metadata"]["resourceVersion"]
        await e.release()
        (after,) = kube.objects(LEASES, "default")
        assert after["spec"]["holderIdentity"] == "" and after["spec"]["leaseDurationSeconds"] == 1
        assert e.lost.is_set() and not e.is_leader


async def test_a_dead_leader_is_replaced_after_the_lease_expires(kube: FakeKube, tmp_path: Path) -> None:
    async with electors(kube, tmp_path, 2) as es:
        await eventually(lambda: any(e.is_leader for e, _ in es), WAIT, "a leader")
        (dead, task) = next((e, t) for e, t in es if e.is_leader)
        task.cancel()  # crashed: no release
        t0 = time.monotonic()
        other = next(e for e, _ in es if e is not dead)
        await eventually(lambda: other.is_leader, WAIT, "takeover")
        assert time.monotonic() - t0 >= 0.9  # waited out the lease duration as observed locally
        assert holder(kube) == other.cfg.identity


async def test_a_leader_that_cannot_renew_steps_down(kube: FakeKube, tmp_path: Path) -> None:
    async with electors(kube, tmp_path, 1) as ((e, task),):
        await eventually(lambda: e.is_leader, WAIT, "leader")
        kube.fail_next(1000, code=503, when=lambda r: r.path.endswith("/leases/epp-default-pool.llm-d.ai"))
        await eventually(lambda: e.lost.is_set(), WAIT, "lost")
        assert not e.is_leader and task.done()
