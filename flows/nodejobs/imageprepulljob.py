"""ImagePrePullJob: pull a list of images on each node ahead of need.

``Check -> Pull``; neither has a failure edge, so any failed action ends the node task. Pull's
``extend`` is the JSON list of per-image results, which becomes ``imageStatus`` (left out of a
large job's compact entry for a node that pulled every image).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from flows.nodejobs.jobtype import ExtendError, JobType
from nodetask import nesting
from nodetask.flow import Flow, Step
from nodetask.phases import ConditionStatus
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.v1alpha2 import ImagePrePullJobSpec, ImagePrePullNodeTaskStatus, ImageStatus

CHECK: Final = "Check"
PULL: Final = "Pull"

FLOW: Final = Flow(name="imageprepulljob", first=CHECK, steps={CHECK: Step(on_success=PULL), PULL: Step()})

_IMAGES: Final = msgspec.json.Decoder(tuple[ImageStatus, ...])


def read_extend(extend: str) -> Mapping[str, tuple[ImageStatus, ...]]:
    """The image statuses a Pull reported."""
    try:
        nesting.check_json(extend)  # JSON inside a string: the frame's own check never saw its brackets
        return {"image_status": _IMAGES.decode(extend)}
    except msgspec.DecodeError as exc:
        raise ExtendError(f"prepull extend is not a JSON list of image statuses: {exc}") from None


def encode_extend(images: tuple[ImageStatus, ...]) -> str:
    """The ``extend`` text an edge sends after a Pull."""
    return msgspec.json.encode(images).decode()


def drop_success_detail(entry: ImagePrePullNodeTaskStatus) -> ImagePrePullNodeTaskStatus:
    """Without ``imageStatus`` when every image was pulled: the spec's image list says the same."""
    if all(image.status is ConditionStatus.TRUE for image in entry.image_status):
        return msgspec.structs.replace(entry, image_status=())
    return entry


JOB_TYPE: Final = JobType(
    kind=IMAGE_PRE_PULL_JOB,
    flow=FLOW,
    spec_type=ImagePrePullJobSpec,
    read_extend=read_extend,
    drop_success_detail=drop_success_detail,
)
