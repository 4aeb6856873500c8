"""The device's cache of cloud objects, kept through outages: what the hub sends, stored durably.

The durable cache (:mod:`.durable_cache`) writes the hub's cache messages to the store and tells
subscribers what changed (:mod:`.view`); the ledger (:mod:`.ledger`) keeps, beside the store,
the keys it failed to store; the autonomy manager (:mod:`.autonomy_manager`) checks and repairs them.
It may import the store (:mod:`roles.edge.store`) and nothing else of the edge.
"""
