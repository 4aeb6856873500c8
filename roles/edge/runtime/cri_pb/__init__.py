"""Generated protobuf code for the CRI ``runtime.v1`` ImageService subset in ``api.proto``.

``api_pb2.py`` and its typed stub ``api_pb2.pyi`` are generated and committed, never edited by
hand. Why committed rather than built at install time or described at run time: the edge then
needs only the ``protobuf`` runtime, not protoc; ``api.proto`` stays the one readable source,
diffable against upstream's ``api.proto``; and the ``.pyi`` gives mypy real message types (a
descriptor built at run time would make every field ``Any``). The price is that the protobuf
runtime pin must stay at or above the generator's version (``Protobuf Python Version`` in
``api_pb2.py``; same major). Regenerate from the repository root after editing ``api.proto``::

    .venv/bin/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. roles/edge/runtime/cri_pb/api.proto

(``just cri-proto``). A test checks the committed files are current.
"""
