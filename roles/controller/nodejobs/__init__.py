"""Node jobs (the KubeEdge kinds): the reconciler that watches jobs and nodes and writes what the decisions say.

The decisions themselves are pure (``decide``, ``retry``); this room does the reading and writing. It may
import the flows, the API types, the kube client, ``roles.common`` and the controller's shared
machinery at the top (``keyed``, ``watches``); never another room of the controller.
"""
