"""Diagnoses (the KubeDiag kinds): the controller that runs each Diagnosis's stages as Tasks, and the OperationSet pass.

The decisions are pure (``flows.diagnosis_*``); this room watches the five kinds and writes what they say.
It may import the flows, the API types, the kube client, ``roles.common`` and the controller's shared
machinery at the top (``keyed``, ``watches``); never another room of the controller.
"""
