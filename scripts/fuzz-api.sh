#!/usr/bin/env bash
# Contract fuzzing: runs schemathesis against openapi.yaml and a real server (mock model,
# temporary SQLite database) and fails on any 5xx or any response that breaks the document.
# The SSE route (GET .../events) is left out: a stream never ends on its own; the tests cover it.
#
#   scripts/fuzz-api.sh [path/to/tah] [max seconds]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
tah=${1:-target/debug/tah}
max_time=${2:-120}
schemathesis=${SCHEMATHESIS:-schemathesis}

work=$(mktemp -d)
cleanup() {
    [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/ws/src"
printf '# Fuzz\n\nA workspace for contract fuzzing.\n' >"$work/ws/README.md"
echo 'fn main() {}' >"$work/ws/src/main.rs"

# The server writes one line to stdout once it accepts connections: {"listening":"ADDR"}.
"$tah" serve --listen 127.0.0.1:0 --database-url "sqlite://$work/fuzz.db" \
    --workspace "$work/ws" >"$work/ready" 2>"$work/log" &
pid=$!
for _ in $(seq 1 100); do
    addr=$(sed -n 's/^{"listening":"\([^"]*\)"}$/http:\/\/\1/p' "$work/ready" | head -n1) || true
    [[ -n ${addr:-} ]] && break
    sleep 0.1
done
if [[ -z ${addr:-} ]]; then
    cat "$work/log" >&2
    echo "fuzz-api: the server did not start" >&2
    exit 1
fi
echo "fuzz-api: server at $addr"

# ensure_resource_availability is left out: a create repeated with an Idempotency-Key the
# fuzzer used before answers the first response, which may name a session deleted since.
# The coverage phase is left out: schemathesis 4 crashes in it on Python 3.11 (an AST
# recursion error inside schemathesis, not a finding).
set +e
"$schemathesis" --config-file schemathesis.toml run openapi.yaml --url "$addr" \
    --phases examples,fuzzing,stateful \
    --checks all \
    --exclude-checks ignored_auth,positive_data_acceptance,ensure_resource_availability \
    --exclude-operation-id events \
    --max-time "$max_time" \
    --request-timeout 20 \
    --suppress-health-check all \
    --workers 2 >"$work/report" 2>&1
status=$?
set -e
# The report quotes whole request bodies (up to the 1 MiB limit); keep the output readable.
cut -c1-400 "$work/report" | tail -n 80
if grep -qi 'panicked' "$work/log"; then
    echo "fuzz-api: the server panicked" >&2
    grep -i -A5 panicked "$work/log" >&2
    exit 1
fi
exit $status
