#!/usr/bin/env bash
# The built-in web page in a real browser: headless Chromium (Debian's `chromium` package)
# driven by playwright-core (pinned in tests/browser/package-lock.json) under `node --test`,
# against real `tah serve` processes (the mock model, and the fake OpenAI model that
# `tah fake-model` serves). The tests start and stop their own servers.
#
#   scripts/browser-tests.sh [path/to/tah]
#
# Screenshots of the main views, and the figures the benchmark measures (figures.json), are
# written to target/screenshots (TAH_SCREENSHOTS overrides it). Chromium is installed with
# apt-get when /usr/bin/chromium is missing (as root, or with sudo); playwright-core is installed
# on first use into tests/browser/node_modules, and reused while the pin is unchanged. It never
# downloads a browser of its own. Needs node >= 20 with npm.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
tah=${1:-target/debug/tah}
dir=tests/browser
started_at=$SECONDS

say() {
    printf 'browser-tests: %s\n' "$*"
}
fail() {
    say "FAILED: $*" >&2
    exit 1
}

[[ -x $tah ]] || fail "no server binary at $tah (build it with cargo build)"

if [[ ! -x /usr/bin/chromium ]]; then
    say "installing Debian's chromium (apt-get)"
    sudo=
    [[ $(id -u) == 0 ]] || sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq chromium >/dev/null 2>&1 \
        || { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq chromium >/dev/null; } \
        || fail "could not install chromium"
fi

stamp=$dir/node_modules/.installed-from-lock
if ! { [[ -f $stamp ]] && cmp -s "$dir/package-lock.json" "$stamp"; }; then
    say "installing playwright-core (npm ci)"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$dir/package-lock.json" "$stamp"
fi
say "versions: node $(node --version), playwright-core" \
    "$(node -p "require('./$dir/node_modules/playwright-core/package.json').version")," \
    "$(/usr/bin/chromium --version 2>/dev/null | head -n1)"
install_done=$SECONDS

# An absolute path as given, a relative one from the repository's root.
if [[ $tah == /* ]]; then export TAH_BIN=$tah; else export TAH_BIN=$PWD/$tah; fi
status=0
(cd "$dir" && node --test --test-concurrency=1) || status=$?
if [[ -f target/screenshots/figures.json ]]; then
    say "figures (target/screenshots/figures.json):"
    cat target/screenshots/figures.json
fi
say "screenshots: $(cd target/screenshots 2>/dev/null && ls -- *.png 2>/dev/null | tr '\n' ' ')"
say "$((SECONDS - install_done)) s after installs, $((SECONDS - started_at)) s in all"
exit "$status"
