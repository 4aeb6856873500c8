"""The demo's second scene: the sample diagnosis over every edge, followed to its end (its world and what it
shows are in :mod:`tools.demo.diagnosis`)."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from tools.demo import diagnosis as diag
from tools.demo.kube import ApiFailure
from tools.demo.state import POLL_SECONDS, SAMPLES_DIR, Demo


def diagnose(demo: Demo) -> None:
    """Apply the diagnosis samples (pipeline first, then the run) and follow the run to its end."""
    assert demo.api is not None
    assert demo.cp is not None
    assert demo.directory is not None
    api = demo.api
    directory = demo.directory
    demo.say(
        f"diagnosis: the fleet's directory at http://127.0.0.1:{directory.port}/network gives each edge its app's"
        f" address; the app of {', '.join(directory.down)} refuses connections (each edge's config lists both"
        " ports in diagnosis.loopbackPorts)"
    )
    listing = diag.render_operations(SAMPLES_DIR, directory_port=directory.port)
    out = demo.cp.kubectl("apply", "-f", "-", input=json.dumps(listing)).stdout
    demo.say(f"kubectl apply -f containers/samples/{diag.OPERATIONS_SAMPLE}: {' '.join(out.split())}")
    manifest = diag.render_diagnosis(SAMPLES_DIR)
    name = manifest["metadata"]["name"]
    operation_set = manifest["spec"]["operationSet"]
    # A Diagnosis of an OperationSet the controller has not seen yet fails at once (OperationSetNotFound).
    demo.wait(
        f"OperationSet {operation_set} to be ready", lambda: diag.operation_set_ready(api, operation_set), limit=60
    )
    out = demo.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest)).stdout
    demo.say(f"kubectl apply -f containers/samples/{diag.DIAGNOSIS_SAMPLE}: {' '.join(out.split())}")
    shown = ""
    deadline = time.monotonic() + demo.args.diagnosis_timeout
    found: dict[str, Any] = {}
    with demo.console.status(f"diagnosis {name}") as status:
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiFailure):
                found = diag.read_diagnosis(api, name)
            now = diag.progress(found) if found else "(not read yet)"
            if now != shown:
                shown = now
                demo.say(f"diagnosis {name}: {now}")
                status.update(f"diagnosis {name}: {now}")
            if (found.get("status") or {}).get("phase") in diag.FINAL_PHASES:
                break
            time.sleep(POLL_SECONDS / 2)
        else:
            demo.say(f"diagnosis {name} did not end within {demo.args.diagnosis_timeout:.0f}s", "bold yellow")
    if found:
        tasks = diag.read_tasks(api, found["metadata"]["uid"])
        demo.diagnosis = diag.view(found, tasks, directory.asked)
