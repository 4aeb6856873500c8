"""The image pushed from its OCI layout to a registry by ``skopeo`` (:mod:`tools.provision.image`). Stdlib only."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tools.provision.image_tools import Tools, run


def push(layout: Path, tag: str, reference: str, *, tools: Tools) -> str:
    """Copy ``layout:tag`` to ``reference`` (``host[:port]/repository[:tag]``); returns the pushed digest."""
    host = reference.split("/", 1)[0]
    loopback = host.split(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]")
    with tempfile.TemporaryDirectory(prefix="nodetaskd-push-") as tmp:
        policy, digest_file = Path(tmp) / "policy.json", Path(tmp) / "digest"
        # skopeo insists on a signature policy; this one accepts anything, so /etc is never read.
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        argv: list[str | Path] = [tools.skopeo, "--policy", policy, "copy", "--quiet", "--digestfile", digest_file]
        if loopback:
            argv.append("--dest-tls-verify=false")
        run([*argv, f"oci:{layout}:{tag}", f"docker://{reference}"], what=f"skopeo copy to {reference}")
        return digest_file.read_text().strip()
