#!/usr/bin/env bash
# The front-end protocol clients, from npm and pinned, against a real server:
#
#   - the Vercel AI SDK (`ai` 7 and 6: AbstractChat + DefaultChatTransport, readUIMessageStream;
#     `@ai-sdk/react` useChat in the page example) on POST/GET …/ai-sdk/chat;
#   - AG-UI (`@ag-ui/client` HttpAgent) on POST …/ag-ui;
#   - the manual's examples (docs/src/protocols.md, tests/protocols/examples/), run as written;
#   - the faces' official SDKs (every other `*.test.mjs`), and the Python SDKs' tests
#     (tests/protocols/py/test_*.py, each run as a script).
#
# Each test file starts its own `tah serve` (mock model, or the fake OpenAI-compatible model of
# `tah fake-model`) on port 0 with a temporary database, and checks what the client library
# reconstructs against tah's own record of the run (GET …/messages, …/events). With
# TAH_TEST_PG_URL set (CI's PostgreSQL test cluster) the protocol suites run again on it.
#
#   scripts/protocol-clients.sh [path/to/tah]
#
# The packages are pinned by tests/protocols/package-lock.json and installed once into
# target/protocol-clients (reused while the lock is unchanged); tests/protocols/node_modules
# links there. The Python packages are pinned by tests/protocols/requirements.txt and installed
# once into the virtualenv target/protocol-clients-venv. Needs node >= 20 with npm, and
# python3 with venv.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
tah=${1:-target/debug/tah}
pins=tests/protocols
cache=target/protocol-clients

say() {
    printf 'protocol-clients: %s\n' "$*"
}

[[ -x $tah ]] || {
    say "FAILED: no server binary at $tah (build it with cargo build)" >&2
    exit 1
}

if ! cmp -s "$pins/package-lock.json" "$cache/.installed-from-lock" 2>/dev/null; then
    say "installing the pinned packages (npm ci, in $cache)"
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$pins/package.json" "$pins/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$pins/package-lock.json" "$cache/.installed-from-lock"
fi
ln -sfn "../../$cache/node_modules" "$pins/node_modules"

version() {
    node -p "require('./$cache/node_modules/$1/package.json').version"
}
say "versions: node $(node --version), ai $(version ai), ai (6) $(version ai6)," \
    "@ai-sdk/react $(version @ai-sdk/react), react $(version react)," \
    "@ag-ui/client $(version @ag-ui/client), @ag-ui/core $(version @ag-ui/core)," \
    "@anthropic-ai/sdk $(version @anthropic-ai/sdk), openai $(version openai)," \
    "@a2a-js/sdk $(version @a2a-js/sdk), @modelcontextprotocol/sdk $(version @modelcontextprotocol/sdk)," \
    "@agentclientprotocol/sdk $(version @agentclientprotocol/sdk)"

venv=target/protocol-clients-venv
if ! cmp -s "$pins/requirements.txt" "$venv/.installed-from" 2>/dev/null; then
    say "installing the pinned Python packages (pip, in $venv)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$pins/requirements.txt"
    cp "$pins/requirements.txt" "$venv/.installed-from"
fi
say "python packages: $("$venv/bin/python3" -m pip freeze 2>/dev/null | grep -i -E '^(anthropic|openai|a2a-sdk)==' | tr '\n' ' ')"

cd "$pins"
TAH_BIN="$root/$tah" node --test --test-concurrency=1 ./*.test.mjs
shopt -s nullglob
for test in py/test_*.py; do
    say "python: $test"
    TAH_BIN="$root/$tah" "$root/$venv/bin/python3" "$test"
done
# The same on PostgreSQL when there is one (CI's test cluster): each server its own database.
if [[ -n ${TAH_TEST_PG_URL:-} ]]; then
    say "again on PostgreSQL"
    TAH_BIN="$root/$tah" TAH_PROTOCOLS_PG_URL=$TAH_TEST_PG_URL node --test ai-sdk.test.mjs ag-ui.test.mjs
fi
