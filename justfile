# nodetaskd developer entry points. `just --list` shows them all.

set shell := ["bash", "-euo", "pipefail", "-c"]

py := ".venv/bin/python"

# List the recipes.
default:
    @just --list

# Test processes at once (pytest-xdist; 0: all in this one), each with its own control plane. Three on two
# cores, as the tests wait on timers more than they compute: a clean run took 14 min with two, 11.5-12.5 with three.
workers := env("NODETASKD_TEST_WORKERS", "3")

# Lint, then run every test (unit + integration) in parallel processes while mypy and the import contracts
# are checked beside them (the tests wait on timers more than they compute); fails if either part did.
# The tests start hundreds of role processes: the project's modules are byte-compiled once for all of them.
test:
    #!/usr/bin/env bash
    set -uo pipefail
    .venv/bin/ruff check . || exit 1
    {{py}} -m compileall -q nodetask roles flows schemas tools
    checks_log=$(mktemp)
    { .venv/bin/mypy && .venv/bin/lint-imports; } > "$checks_log" 2>&1 &
    checking=$!
    {{py}} -m pytest -q -n {{workers}} --dist loadscope --no-loadscope-reorder --durations=25
    tests=$?
    wait "$checking"
    checks=$?
    echo "--- mypy --strict and the import contracts (exit $checks):"
    cat "$checks_log"
    rm -f "$checks_log"
    exit $(( tests != 0 || checks != 0 ))

# Ruff, mypy --strict and the import-linter contracts.
lint:
    .venv/bin/ruff check .
    .venv/bin/mypy
    .venv/bin/lint-imports

# Only the unit tests (no control plane needed).
unit:
    {{py}} -m pytest -q tests/unit

# Regenerate the CRD manifests in schemas/crds from the Struct types (and their copies in containers/deploy).
crds:
    {{py}} -m schemas.crdgen
    {{py}} -m tools.provision.deploy_crds

# Start the local control plane (kube-apiserver + etcd on loopback); prints the KUBECONFIG line.
cluster-up:
    python3 tools/provision/controlplane.py up

# Stop the local control plane.
cluster-down:
    python3 tools/provision/controlplane.py down

# The main job, live: control plane, containerd + registry, controller, 2 hubs, 12 edges, sample jobs; `just demo --help`.
demo *ARGS:
    {{py}} -m tools.demo {{ARGS}}

# A node job over a simulated, in-process fleet through the real core, in virtual time.
simulate *ARGS:
    {{py}} -m tools.demo.simulate {{ARGS}}

# Run the benchmarks (own control plane on loopback) and write docs/benchmarks.md; `just bench --help`.
bench *ARGS:
    {{py}} -m bench.run {{ARGS}}

# Format the code.
fmt:
    .venv/bin/ruff check --fix .
    .venv/bin/ruff format .

# Regenerate the CRI protobuf code from roles/edge/runtime/cri_pb/api.proto.
cri-proto:
    {{py}} -m grpc_tools.protoc -I . --python_out=. --pyi_out=. roles/edge/runtime/cri_pb/api.proto
