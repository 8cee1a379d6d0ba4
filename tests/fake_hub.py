"""A model hub on 127.0.0.1 that speaks the part of the Hub's HTTP API an upload of a folder
uses (repository creation, preupload, commit), keeping what it was sent; for the tests of
output.push_to_hub, run against huggingface_hub itself through HF_ENDPOINT."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class _Handler(BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        hub = self.server
        hub.calls.append(("POST", path, self.headers.get("Authorization")))
        if path == "/api/repos/create":
            request = json.loads(body)
            hub.created.append(request)
            repo = "/".join(p for p in (request.get("organization"), request["name"]) if p)
            return self._reply(200, {"url": f"{hub.url}/{repo}"})
        if path.endswith("/preupload/main"):
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
            ]
            return self._reply(200, {"files": modes})
        if path.endswith("/commit/main"):
            repo = path[len("/api/models/") : -len("/commit/main")]
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    hub.messages.append(item["value"]["summary"])
                elif item["key"] == "file":
                    hub.files[(repo, item["value"]["path"])] = base64.b64decode(
                        item["value"]["content"]
                    )
            return self._reply(
                200, {"commitUrl": f"{hub.url}/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40}
            )
        return self._reply(404, {"error": f"not served here: {path}"})

    def do_GET(self) -> None:
        self.server.calls.append(("GET", urlsplit(self.path).path, None))
        self._reply(404, {"error": "not served here"})


class FakeHub(ThreadingHTTPServer):
    """Serves in a thread from construction; ``url`` is its endpoint, ``files`` (repo, path)
    -> bytes of every committed file, ``created`` the repository-creation requests."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.calls: list[tuple] = []
        self.created: list[dict] = []
        self.messages: list[str] = []
        self.files: dict[tuple[str, str], bytes] = {}
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
