"""API types of the ``operations.kubeedge.io`` node jobs, and their generated CRDs."""
