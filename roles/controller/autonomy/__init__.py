"""Edge autonomy, the controller's side: the approval label on Nodes and the binding of their Pods' tolerations.

The rules are pure (``flows.autonomy.approval``, ``flows.autonomy.toleration_binding``,
``flows.autonomy.binding_pace``); this
room watches Namespaces, Nodes and Pods and writes what the rules say. It may import the flows, the API
types, the kube client, ``roles.common`` and the controller's shared machinery at the top (``keyed``,
``watches``); never another room of the controller.
"""
