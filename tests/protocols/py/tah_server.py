"""A real tah server for the Python SDK tests: `tah serve` on port 0 with a temporary SQLite
database and workspace and the mock model, its address read from the ready line it writes to
stdout. TAH_BIN names the binary (scripts/protocol-clients.sh sets it)."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.request


class Tah:
    def __init__(self, extra_args=(), mock_delay_ms=0):
        binary = os.environ["TAH_BIN"]
        self.dir = tempfile.mkdtemp(prefix="tah-py-")
        self.workspace = os.path.join(self.dir, "ws")
        os.makedirs(self.workspace)
        with open(os.path.join(self.workspace, "README.md"), "w") as f:
            f.write("# Demo\n\nA small workspace for the Python clients.\n")
        self.database = "sqlite://" + os.path.join(self.dir, "data.db")
        self.binary = binary
        self.child = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--database-url", self.database,
             "--workspace", self.workspace, "--provider", "mock",
             "--mock-delay-ms", str(mock_delay_ms), *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.child.stderr), daemon=True).start()
        for line in self.child.stdout:
            try:
                self.url = "http://" + json.loads(line)["listening"]
                break
            except (ValueError, KeyError):
                continue
        else:
            raise RuntimeError("tah serve wrote no ready line:\n" + "".join(self.log))

    def cli(self, *args):
        """Runs `tah ARGS… --database-url <this server's>` and returns its stdout."""
        return subprocess.run([self.binary, *args, "--database-url", self.database],
                              check=True, capture_output=True, text=True).stdout

    def api(self, method, path, body=None, token=None):
        """tah's own API, as JSON: (status, body)."""
        headers = {"content-type": "application/json"} if body is not None else {}
        if token:
            headers["authorization"] = "Bearer " + token
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request) as response:
                text = response.read()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            text = error.read()
            return error.code, json.loads(text) if text else None

    def close(self):
        self.child.terminate()
        self.child.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()
