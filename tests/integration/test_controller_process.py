"""``nodetaskd --role=controller`` as a real process: leads, serves and registers its webhooks, stops cleanly."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import anyio
import msgspec
import pytest

from nodetask.phases import JobPhase
from roles.common.version import package_version
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, kubectl, unique
from tools.ports import free_ports
from tools.processes import http_get, role_command
from tools.provision.controlplane import ControlPlaneError

pytestmark = pytest.mark.integration


async def _until_refused(crds: ControlPlane, kind: str, spec: dict[str, object], *, refused: bool) -> None:
    """Wait until a dry-run create of such a job is refused (by a webhook: the schema admits both probes), or not."""
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": kind, "metadata": {"name": "probe"}, "spec": spec}
    with anyio.fail_after(30):
        while True:
            try:
                await kubectl(crds, "create", "--dry-run=server", "-f", "-", input=msgspec.json.encode(doc).decode())
            except ControlPlaneError:
                if refused:
                    return
            else:
                if not refused:
                    return
            await anyio.sleep(0.2)


async def test_controller_process_leads_validates_defaults_and_stops_on_sigterm(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """The process registers its webhooks, rejects a bad job, defaults a good one, reconciles it, exits 0."""
    webhook_port, metrics_port = free_ports(2)
    config = {
        "kubeconfig": str(crds.kubeconfig("controller")),
        "identity": "process-test",
        "leaseName": unique("process-lease"),
        "leaseDuration": 3,
        "listenHost": "127.0.0.1",
        "webhookPort": webhook_port,
        "webhookUrl": f"https://127.0.0.1:{webhook_port}",
        "certDir": str(tmp_path / "tls"),
        "metricsPort": metrics_port,
    }
    (tmp_path / "controller.yaml").write_bytes(msgspec.yaml.encode(config))
    command = role_command("controller", tmp_path / "controller.yaml")
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        with anyio.fail_after(30):
            while True:
                served = (await anyio.to_thread.run_sync(http_get, metrics))[1]
                if "nodetaskd_controller_leader 1.0" in served:
                    break
                await anyio.sleep(0.2)
        assert f'nodetaskd_build_info{{version="{package_version()}"}} 1.0' in served
        # The API server enforces webhooks once its own watch has seen them: wait until a probe is refused.
        await _until_refused(crds, "NodeUpgradeJob", {"version": "latest", "nodeNames": ["a"]}, refused=True)
        with pytest.raises(ControlPlaneError, match=r"spec\.version"):
            await create_job(crds, "NodeUpgradeJob", unique("bad"), {"version": "latest", "nodeNames": ["a"]})
        name = unique("defaulted")
        await create_job(
            crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"nodeNames": ["a"], "images": ["a/b:1"]}}
        )
        with anyio.fail_after(20):
            while True:
                job = await cloud_kube.get(job_resource(IMAGE_PRE_PULL_JOB), name)
                if job.status.phase is not JobPhase.NONE:
                    break
                await anyio.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            code = await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            # The webhooks outlive the process on purpose; the tests after this one must not meet them.
            await kubectl(
                crds,
                "delete",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                "nodetaskd",
                "--ignore-not-found",
            )
            # Their policy is Fail and their server is gone: wait until the API server has dropped them.
            probe: dict[str, object] = {"imagePrePullTemplate": {"nodeNames": ["a"], "images": ["a/b:1"]}}
            await _until_refused(crds, "ImagePrePullJob", probe, refused=False)
    assert code == 0
    template = job.spec.image_pre_pull_template
    assert (template.concurrency, template.timeout_seconds) == (1, 300)
    assert job.metadata.finalizers == ("kubeedge.io/imageprepulljob-controller",)
