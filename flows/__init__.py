"""One module per job type: its action flow, spec type and how a report changes a node's status."""
