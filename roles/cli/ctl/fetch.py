"""What ``ctl get``, ``describe``, ``confirm`` and ``nodes`` read and write, through the project's Kube client."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from roles.cli.ctl.views import (
    EdgeRow,
    EventRow,
    JobSummary,
    NodeRow,
    confirm_value,
    confirmable,
    edge_rows,
    event_rows,
    find_kind,
    node_rows,
    paused_for_confirmation,
    retry_value,
    summarize,
)
from roles.common.events import EVENT_NAMESPACE
from roles.kube import Conflict, Kube, NotFound, Resource
from roles.kube.resources import EVENTS, NODES, job_resource
from schemas.core import CONFIRM_ANNOTATION, RETRY_ANNOTATION
from schemas.kinds import KINDS, Kind
from schemas.retry import RETRIABLE_NODE_PHASES, requested_retry, retry_refusal

__all__ = [
    "Confirmed",
    "CtlError",
    "Described",
    "Retried",
    "confirm",
    "describe",
    "edges",
    "events_selector",
    "job_objects",
    "jobs",
    "objects_list",
    "resolve",
    "retry",
]

EVENTS_SHOWN: Final = 10
ANNOTATE_ATTEMPTS: Final = 5


class CtlError(ValueError):
    """A job argument that names no job (or several), or a request that does not apply; the message says which."""


async def resolve(kube: Kube, text: str) -> tuple[Kind, Any]:
    """The job ``text`` names (``NAME`` or ``KIND/NAME``) and its kind.

    Errors: :class:`CtlError` when no kind has such a job, or several do (then the kind must be said).
    """
    kind_text, sep, name = text.rpartition("/")
    if not name:
        raise CtlError(f"{text!r} names no job")
    try:
        kinds = [find_kind(kind_text)] if sep else list(KINDS)
    except ValueError as exc:
        raise CtlError(str(exc)) from None
    found = []
    for kind in kinds:
        try:
            found.append((kind, await kube.get(job_resource(kind), name)))
        except NotFound:
            continue
    if not found:
        return _none(text, kinds)
    if len(found) > 1:
        names = " and ".join(f"{kind.singular}/{name}" for kind, _ in found)
        raise CtlError(f"{name!r} names several jobs ({names}): say which, e.g. {found[0][0].singular}/{name}")
    return found[0]


def _none(text: str, kinds: list[Kind]) -> tuple[Kind, Any]:
    where = kinds[0].plural if len(kinds) == 1 else "node jobs (nodeupgradejobs, imageprepulljobs, configupdatejobs)"
    raise CtlError(f"no job {text!r} among the {where}")


async def jobs(kube: Kube, kinds: tuple[Kind, ...] = KINDS, *, selector: str = "") -> list[JobSummary]:
    """Every job of ``kinds`` (whose labels match ``selector``, when given), by kind then name."""
    found: list[JobSummary] = []
    for kind in kinds:
        listed, _, _ = await kube.list(job_resource(kind), label_selector=selector)
        found.extend(summarize(kind, job) for job in sorted(listed, key=lambda j: j.metadata.name))
    return found


async def job_objects(
    kube: Kube, kinds: tuple[Kind, ...] = KINDS, *, selector: str = "", managed_fields: bool = False
) -> dict[str, Any]:
    """The jobs of ``kinds`` as the API server has them in one ``List``, as ``kubectl get -o json`` prints them."""
    resources = [job_resource(kind) for kind in kinds]
    return await objects_list(kube, resources, selector=selector, managed_fields=managed_fields)


async def objects_list(
    kube: Kube,
    resources: Sequence[Resource[Any]],
    *,
    selector: str = "",
    managed_fields: bool = False,
    namespace: str = "",
) -> dict[str, Any]:
    """The objects of ``resources`` (of ``namespace``, or all of them) as the API server has them, in one
    ``List`` as ``kubectl get -o json`` prints it: every field, but ``metadata.managedFields`` only when asked
    for; by namespace and name within each resource."""
    items: list[Any] = []

    def key(item: Any) -> tuple[str, str]:
        meta = item.get("metadata", {})
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    for resource in resources:
        listed = msgspec.json.decode(await kube.list_raw(resource, label_selector=selector, namespace=namespace))
        for item in sorted(listed.get("items") or [], key=key):
            if not managed_fields:
                item.get("metadata", {}).pop("managedFields", None)
            items.append(item)
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def events_selector(kind: Kind, name: str) -> str:
    """The field selector of the Events about job ``name`` (recorded in :data:`EVENT_NAMESPACE`)."""
    return f"involvedObject.kind={kind.kind},involvedObject.name={name}"


@dataclass(frozen=True, slots=True)
class Described:
    job: JobSummary
    nodes: list[NodeRow]
    events: list[EventRow]


async def describe(kube: Kube, text: str) -> Described:
    """The job, a row per node (with each Node's hub and agent version) and its latest Events."""
    kind, job = await resolve(kube, text)
    nodes, _, _ = await kube.list(NODES)
    events, _, _ = await kube.list(
        EVENTS, namespace=EVENT_NAMESPACE, field_selector=events_selector(kind, job.metadata.name)
    )
    return Described(
        job=summarize(kind, job),
        nodes=node_rows(job, {n.metadata.name: n for n in nodes}),
        events=event_rows(events, limit=EVENTS_SHOWN),
    )


@dataclass(frozen=True, slots=True)
class Confirmed:
    job: str
    before: str
    after: str
    paused: list[str]
    """Nodes paused at WaitingConfirmation when the annotation was written."""


async def confirm(kube: Kube, text: str, nodes: tuple[str, ...], *, every: bool) -> Confirmed:
    """Add ``nodes`` (or ``*``) to the job's confirm annotation, which the hubs act on.

    The write is conditional on the job's resourceVersion, so two operators confirming at once
    both get their nodes in. Errors: :class:`CtlError` for a job that cannot wait for confirmation,
    no nodes given, or nodes the job does not have.
    """
    kind, job = await resolve(kube, text)
    ref = f"{kind.singular}/{job.metadata.name}"
    if not confirmable(kind):
        raise CtlError(f"{ref}: only NodeUpgradeJobs wait for a confirmation (spec.requireConfirmation)")
    if not nodes and not every:
        raise CtlError(f"{ref}: name the nodes to release, or --all")
    known = {entry.node_name for entry in job.status.node_status}
    unknown = sorted(set(nodes) - known)
    if unknown:
        raise CtlError(f"{ref} has no node {', '.join(unknown)} (its nodes: {', '.join(sorted(known)) or 'none yet'})")
    done = await _annotate(
        kube, kind, job, lambda j: _confirm_change(j.metadata.annotations.get(CONFIRM_ANNOTATION, ""), nodes, every)
    )
    before = done.read.metadata.annotations.get(CONFIRM_ANNOTATION, "")
    after = before if done.wanted is None else str(done.wanted[CONFIRM_ANNOTATION])
    return Confirmed(job=ref, before=before, after=after, paused=paused_for_confirmation(done.written or done.read))


def _confirm_change(current: str, nodes: tuple[str, ...], every: bool) -> dict[str, str | None] | None:
    wanted = confirm_value(current, nodes, every=every)
    return None if wanted == current else {CONFIRM_ANNOTATION: wanted}


@dataclass(frozen=True, slots=True)
class _Annotated:
    read: Any
    """The job as last read: what the change was made from."""
    wanted: dict[str, str | None] | None
    """The annotations written (None: the change asked for nothing)."""
    written: Any | None


async def _annotate(
    kube: Kube, kind: Kind, job: Any, change: Callable[[Any], dict[str, str | None] | None]
) -> _Annotated:
    """Write the annotations ``change`` asks of the job as read (None: nothing), conditionally on its
    resourceVersion, reading it again after a conflict. Errors: what ``change`` raises; :class:`CtlError`
    past :data:`ANNOTATE_ATTEMPTS` conflicts."""
    resource = job_resource(kind)
    for _ in range(ANNOTATE_ATTEMPTS):
        wanted = change(job)
        if wanted is None:
            return _Annotated(job, None, None)
        # A merge patch's null removes an annotation.
        patch = {"metadata": {"resourceVersion": job.metadata.resource_version, "annotations": wanted}}
        try:
            return _Annotated(job, wanted, await kube.merge_patch(resource, job.metadata.name, patch))
        except Conflict:
            job = await kube.get(resource, job.metadata.name)
    ref = f"{kind.singular}/{job.metadata.name}"
    raise CtlError(f"{ref} kept changing under {ANNOTATE_ATTEMPTS} attempts to annotate it; try again")


@dataclass(frozen=True, slots=True)
class Retried:
    job: str
    value: str
    """The retry annotation's value now; ``requested`` says whether this command wrote it."""
    requested: bool
    nodes: list[str]
    """The nodes the retry runs again (Failure and Unknown)."""
    cleared_confirm: str
    """The confirm annotation this command took away (empty: there was none, or it was kept)."""


async def retry(kube: Kube, text: str, *, keep_confirmations: bool) -> Retried:
    """Ask the controller to retry a finished job's failed nodes: a new retry annotation value.

    A confirm annotation is taken away in the same write unless ``keep_confirmations``: it released the
    last attempt's nodes, and would release the retried ones unasked. The write is conditional on the
    job's resourceVersion. A value the controller has not handled yet is left as it is. Errors:
    :class:`CtlError` naming why a job cannot be retried (the admission webhook's own rule).
    """
    kind, job = await resolve(kube, text)
    ref = f"{kind.singular}/{job.metadata.name}"

    def change(job: Any) -> dict[str, str | None] | None:
        status = job.status
        if requested_retry(job.metadata.annotations, status.retry) is not None:
            return None
        if refusal := retry_refusal(status.phase, (e.phase for e in status.node_status)):
            raise CtlError(f"{ref} cannot be retried: {refusal}")
        return _retry_annotations(job, keep_confirmations=keep_confirmations)

    done = await _annotate(kube, kind, job, change)
    status, annotations = done.read.status, done.read.metadata.annotations
    nodes = sorted(e.node_name for e in status.node_status if e.phase in RETRIABLE_NODE_PHASES)
    if done.wanted is None:
        value = requested_retry(annotations, status.retry) or ""
        return Retried(job=ref, value=value, requested=False, nodes=nodes, cleared_confirm="")
    cleared = annotations.get(CONFIRM_ANNOTATION, "") if CONFIRM_ANNOTATION in done.wanted else ""
    value = str(done.wanted[RETRY_ANNOTATION])
    return Retried(job=ref, value=value, requested=True, nodes=nodes, cleared_confirm=cleared)


def _retry_annotations(job: Any, *, keep_confirmations: bool) -> dict[str, str | None]:
    """A new retry value, and the confirm annotation taken away (None) unless kept or absent."""
    handled = job.status.retry.handled if job.status.retry is not None else ""
    annotations = job.metadata.annotations
    wanted: dict[str, str | None] = {RETRY_ANNOTATION: retry_value(annotations.get(RETRY_ANNOTATION), handled)}
    if not keep_confirmations and annotations.get(CONFIRM_ANNOTATION):
        wanted[CONFIRM_ANNOTATION] = None
    return wanted


async def edges(kube: Kube) -> list[EdgeRow]:
    nodes, _, _ = await kube.list(NODES)
    return edge_rows(nodes)
