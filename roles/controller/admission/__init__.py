"""Admission: the validating and defaulting webhooks every controller replica serves, leader or not.

Answering AdmissionReviews, registering the webhook configurations, and the HTTPS server with its
rotated certificate. It may import the API types and their validation rules, the kube client and
``roles.common``; nothing of the controller's other rooms, so admission never waits on the election.
"""
