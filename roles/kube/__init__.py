"""Kubernetes access for the controller and cloud roles.

The only package that imports kubernetes_asyncio and trio_asyncio. kubernetes-asyncio (aiohttp)
needs an asyncio loop, which trio-asyncio runs inside trio. Two rules keep that bridge safe (both
measured; see ``docs`` in the project style guide):

* every call crosses from trio to asyncio as ONE coroutine (``aio_as_trio(fn)(...)``) - never iterate
  an asyncio async iterator from trio, which crashes trio-asyncio under concurrent cancellation;
* every watch loop runs entirely on the asyncio side and hands events to trio with synchronous calls
  only (``send_nowait`` on a memory stream); asyncio code never awaits a trio or anyio object.
"""

from roles.kube.client import Kube, open_kube
from roles.kube.errors import ApiError, Conflict, Gone, KubeconfigError, NotFound, Unserved
from roles.kube.resources import Resource
from roles.kube.watching import Deleted, Interrupted, Invalid, Relisted, Upserted, WatchEvent

__all__ = [
    "ApiError",
    "Conflict",
    "Deleted",
    "Gone",
    "Interrupted",
    "Invalid",
    "Kube",
    "KubeconfigError",
    "NotFound",
    "Relisted",
    "Resource",
    "Unserved",
    "Upserted",
    "WatchEvent",
    "open_kube",
]
