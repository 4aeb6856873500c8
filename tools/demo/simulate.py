"""Simulate a node job over an in-process fleet, through the real shared core.

``just simulate`` runs an ImagePrePullJob on N simulated edges: the job pool dispatches under the
job's concurrency, each edge walks the job type's flow and reports every action, the reports are
merged into node statuses and the job phase is recomputed after each one - the same functions the
hub and the controller use. Time is trio's virtual clock, so a "minutes-long" job runs instantly.
No Kubernetes or device is involved; the live demo on the local control plane is ``just demo``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Awaitable, Callable
from decimal import Decimal

import anyio
import msgspec
import trio
import trio.testing

from flows.nodejobs import imageprepulljob
from flows.nodejobs.jobtype import apply_result
from nodetask.clock import Clock
from nodetask.job_phase import count_phases, job_phase
from nodetask.messages import ActionResult
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from nodetask.pool import NodeTaskEnd, open_job_pool
from schemas.v1alpha2 import ImagePrePullNodeTaskStatus, ImageStatus


async def simulate(nodes: int, concurrency: int, tolerance: Decimal, fail_rate: float, seed: int) -> JobPhase:
    rng = random.Random(seed)
    clock = Clock.start()
    jt = imageprepulljob.JOB_TYPE
    status = {
        f"edge-{i:03d}": ImagePrePullNodeTaskStatus(node_name=f"edge-{i:03d}", phase=NodeTaskPhase.PENDING)
        for i in range(nodes)
    }
    phase = JobPhase.INIT

    def report(node: str, result: ActionResult) -> None:
        nonlocal phase
        merged = apply_result(jt, status[node], result, now=clock.stamp())
        if merged is None:
            return
        status[node] = merged
        verdict = job_phase(count_phases(s.phase for s in status.values()), tolerance)
        if verdict.phase != phase or merged.phase.terminal:
            counts = count_phases(s.phase for s in status.values())
            print(
                f"t={anyio.current_time():7.1f}s  {node} {result.action:<5} {'ok ' if result.succ else 'ERR'} "
                f"-> node {merged.phase:<10} job {verdict.phase:<10} "
                f"done {counts.successful:>3} failed {counts.failed:>3} running {counts.in_progress:>3}"
            )
        phase = verdict.phase
        if verdict.reason:
            print(f"           reason: {verdict.reason}")

    def edge(node: str) -> Callable[[], Awaitable[None]]:
        async def walk() -> None:
            action: str | None = jt.flow.first
            while action is not None:
                await anyio.sleep(rng.uniform(1, 20))
                ok = rng.random() >= fail_rate
                extend = ""
                if action == imageprepulljob.PULL:
                    state = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
                    extend = imageprepulljob.encode_extend((ImageStatus(image="nginx:1.25", status=state),))
                result = ActionResult(
                    action=action,
                    succ=ok,
                    finish_time=clock.stamp(),
                    extend=extend,
                    reason="" if ok else "simulated failure",
                )
                report(node, result)
                action = jt.flow.next(action, ok)

        return walk

    def ended(node: str, end: NodeTaskEnd) -> None:
        if end is not NodeTaskEnd.FINISHED:
            print(f"           {node} ended: {end}")

    print(f"ImagePrePullJob over {nodes} simulated edges, concurrency {concurrency}, failureTolerate {tolerance}")
    async with open_job_pool(uid="sim", concurrency=concurrency) as pool:
        for node in status:
            pool.start(node, edge(node), timeout=300, on_end=ended)
    print(f"job {phase} after {anyio.current_time():.1f}s of virtual time; peak in flight {pool.peak_in_flight}")
    print(msgspec.json.format(msgspec.json.encode(next(iter(status.values()))).decode()))
    return phase


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--failure-tolerate", type=Decimal, default=Decimal("0.2"))
    p.add_argument("--fail-rate", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    phase = trio.run(
        simulate,
        a.nodes,
        a.concurrency,
        a.failure_tolerate,
        a.fail_rate,
        a.seed,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    return 0 if phase is JobPhase.COMPLETED else 1


if __name__ == "__main__":
    raise SystemExit(main())
