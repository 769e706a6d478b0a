#!/usr/bin/env bash
# Contract fuzzing: runs schemathesis against openapi.yaml and a real server (mock model,
# temporary SQLite database) and fails on any 5xx or any response that breaks the document.
# The SSE route (GET .../events) is left out: a stream never ends on its own; the tests cover it.
# The server has a deployment token; the fuzzer runs twice on it, within the one time budget:
# as the operator (two thirds of it), then with a member's key made with `POST /v1/keys` (a
# third), so the answers a member gets (its 403s and 404s among them) are held to the document
# too.
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

operator=fuzz-operator-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

# The server writes one line to stdout once it accepts connections: {"listening":"ADDR"}.
"$tah" serve --listen 127.0.0.1:0 --database-url "sqlite://$work/fuzz.db" \
    --workspace "$work/ws" --api-token "$operator" >"$work/ready" 2>"$work/log" &
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
fuzz_as() { # NAME BEARER SECONDS
    echo "fuzz-api: as $1, for at most $3 s"
    "$schemathesis" --config-file schemathesis.toml run openapi.yaml --url "$addr" \
        --header "Authorization: Bearer $2" \
        --phases examples,fuzzing,stateful \
        --checks all \
        --exclude-checks ignored_auth,positive_data_acceptance,ensure_resource_availability \
        --exclude-operation-id events \
        --max-time "$3" \
        --request-timeout 20 \
        --suppress-health-check all \
        --workers 2 >"$work/report-$1" 2>&1
    local status=$?
    # The report quotes whole request bodies (up to the 1 MiB limit); keep the output readable.
    # The failures section comes before the summary's long tail: show it whole on a failure.
    if [[ $status -ne 0 ]]; then
        sed -n '/^=* FAILURES =*$/,/^=* SUMMARY =*$/p' "$work/report-$1" | cut -c1-400 | head -n 200
    fi
    cut -c1-400 "$work/report-$1" | tail -n 80
    return $status
}
member_time=$((max_time / 3))
set +e
fuzz_as operator "$operator" $((max_time - member_time))
status=$?
# A member of tenant `default`, made by the operator.
made=$(curl -sS -X POST "$addr/v1/keys" -H "Authorization: Bearer $operator" \
    -H 'Content-Type: application/json' \
    -d '{"tenant": "default", "role": "member", "name": "fuzz-member"}') || made=""
member=$(printf '%s' "$made" | sed -n 's/.*"key": *"\(tah_[0-9a-f]*\)".*/\1/p')
if [[ -z $member ]]; then
    echo "fuzz-api: POST /v1/keys made no member key: $made" >&2
    exit 1
fi
fuzz_as member "$member" "$member_time"
member_status=$?
set -e
if grep -qi 'panicked' "$work/log"; then
    echo "fuzz-api: the server panicked" >&2
    grep -i -A5 panicked "$work/log" >&2
    exit 1
fi
((status != 0)) && echo "fuzz-api: the operator's run failed" >&2
((member_status != 0)) && echo "fuzz-api: the member's run failed" >&2
((status == 0 && member_status == 0))
