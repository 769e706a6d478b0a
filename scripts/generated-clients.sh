#!/usr/bin/env bash
# Clients generated from openapi.yaml, driven against a real server:
#
#   0. openapi.yaml's event schemas are checked against src/model/event.rs (EventKind).
#   1. TypeScript: openapi-typescript generates the types, `tsc --strict` type-checks a program
#      that uses them through openapi-fetch, and node runs it against the server.
#   2. Python: openapi-python-client generates a client package (warnings are failures), and a
#      script drives the same flow through it, reading the SSE streams with httpx-sse and
#      parsing every frame with the generated event models.
#
# Both create a session, run a turn (?wait=true), read the events as JSON pages, fork, compact
# and cancel, list and download the artifacts of a session in its own workspace, and create an
# agent, run a session pinned to it, update it (If-Match), follow its latest version and
# archive it, asserting on the typed results. The server is started here (mock model, a
# temporary SQLite database, a small workspace, an API token) and stopped at the end.
#
#   scripts/generated-clients.sh [path/to/tah]
#
# The tools are pinned (tests/clients/ts/package-lock.json, tests/clients/py/requirements.txt)
# and installed on first use into tests/clients/ts/node_modules and target/clients-venv; later
# runs reuse them while the pins are unchanged. Needs node >= 20 with npm, python3 >= 3.11, curl.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
tah=${1:-target/debug/tah}
ts_dir=tests/clients/ts
py_dir=tests/clients/py
venv=target/clients-venv
generated=target/generated-clients
started_at=$SECONDS

say() {
    printf 'generated-clients: %s\n' "$*"
}
fail() {
    say "FAILED: $*" >&2
    exit 1
}

[[ -x $tah ]] || fail "no server binary at $tah (build it with cargo build)"

work=$(mktemp -d)
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# ---- installs (skipped while the pins are unchanged) -----------------------------------------

# A stamp beside what was installed records the pin file it came from.
fresh() {
    local pins=$1 stamp=$2
    [[ -f $stamp ]] && cmp -s "$pins" "$stamp"
}

if ! fresh "$ts_dir/package-lock.json" "$ts_dir/node_modules/.installed-from-lock"; then
    say "installing the TypeScript tools (npm ci)"
    (cd "$ts_dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$ts_dir/package-lock.json" "$ts_dir/node_modules/.installed-from-lock"
fi

if ! fresh "$py_dir/requirements.txt" "$venv/.installed-from-requirements"; then
    say "installing the Python tools (pip, in $venv)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$py_dir/requirements.txt"
    cp "$py_dir/requirements.txt" "$venv/.installed-from-requirements"
fi
export PATH="$root/$venv/bin:$PATH"

node_version() {
    node -p "require('./$ts_dir/node_modules/$1/package.json').version"
}
say "versions: node $(node --version), typescript $(node_version typescript)," \
    "openapi-typescript $(node_version openapi-typescript), openapi-fetch $(node_version openapi-fetch)"
say "versions: $("$venv/bin/python" --version)," \
    "$(openapi-python-client --version | sed 's/ version: / /')," \
    "httpx $("$venv/bin/python" -c 'import httpx; print(httpx.__version__)')," \
    "httpx-sse $("$venv/bin/python" -c 'from importlib.metadata import version; print(version("httpx-sse"))')"
install_done=$SECONDS

# ---- generate and type-check -----------------------------------------------------------------

# The event schemas say what the server sends: one per EventKind variant, the same fields.
"$venv/bin/python" tests/clients/event_schemas.py || fail "openapi.yaml's events differ from src/model/event.rs"

say "openapi-typescript: openapi.yaml -> $ts_dir/generated/api.d.ts"
mkdir -p "$ts_dir/generated"
"$ts_dir/node_modules/.bin/openapi-typescript" openapi.yaml -o "$ts_dir/generated/api.d.ts" \
    >"$work/openapi-typescript.log" 2>&1 || {
    cat "$work/openapi-typescript.log" >&2
    fail "openapi-typescript"
}
if grep -qi -e warn -e error "$work/openapi-typescript.log"; then
    cat "$work/openapi-typescript.log" >&2
    fail "openapi-typescript complained about openapi.yaml"
fi

say "tsc --strict"
rm -rf "$ts_dir/dist"
"$ts_dir/node_modules/.bin/tsc" -p "$ts_dir" --strict || fail "the TypeScript client does not type-check"

say "openapi-python-client: openapi.yaml -> $generated/py/tah_client"
rm -rf "$generated/py"
mkdir -p "$generated/py"
openapi-python-client generate --path openapi.yaml --config "$py_dir/openapi-python-client.yaml" \
    --meta none --output-path "$generated/py/tah_client" --fail-on-warning \
    >"$work/openapi-python-client.log" 2>&1 || {
    cat "$work/openapi-python-client.log" >&2
    fail "openapi-python-client"
}

# ---- the server ------------------------------------------------------------------------------

mkdir -p "$work/ws/src"
printf '# Clients\n\nA small workspace for the generated clients.\n' >"$work/ws/README.md"
echo 'fn main() {}' >"$work/ws/src/main.rs"
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# A short delay between the mock's pieces gives a run long enough to be cancelled midway.
"$tah" serve --listen 127.0.0.1:0 --database-url "sqlite://$work/d.db" --workspace "$work/ws" \
    --mock-delay-ms 10 --api-token "$token" 2>"$work/server.log" &
pid=$!
addr=
for _ in $(seq 1 100); do
    addr=$(grep -o 'listening on http://[0-9.:]*' "$work/server.log" | head -n1 | sed 's/listening on //') || true
    [[ -n $addr ]] && curl -sf "$addr/healthz" >/dev/null && break
    addr=
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -z $addr ]]; then
    cat "$work/server.log" >&2
    fail "the server did not start"
fi
say "server at $addr"

# ---- drive it --------------------------------------------------------------------------------

status=0
say "TypeScript client (openapi-fetch)"
TAH_URL=$addr TAH_TOKEN=$token node "$ts_dir/dist/drive.js" || status=1
say "Python client (openapi-python-client, httpx-sse)"
TAH_URL=$addr TAH_TOKEN=$token PYTHONPATH="$root/$generated/py" \
    "$venv/bin/python" "$py_dir/drive.py" || status=1

if grep -qi panicked "$work/server.log"; then
    grep -i -A5 panicked "$work/server.log" >&2
    status=1
fi
if [[ $status -ne 0 ]]; then
    say "the server's log:" >&2
    tail -n 40 "$work/server.log" >&2
    fail "a generated client failed against the server"
fi
say "ok: both clients passed ($((SECONDS - install_done)) s after installs, $((SECONDS - started_at)) s in all)"
