"""The three roles of ``nodetaskd`` and the wiring to the API server, websockets and the device."""
