"""A mirror of the Multi30k repository's files on a local HTTP server (127.0.0.1), for the download's tests.

The mirror is built from the local flat copy: its raw files are the repository's bytes, and its tok/*.gz decompress
to the repository's tok files (which are not gzipped there). The server can corrupt a file or close the connection
half-way through one, and records every path asked for.
"""

from __future__ import annotations

import gzip
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rpr_mt.data import multi30k

PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def build_mirror(flat: Path, root: Path) -> Path:
    """``root`` laid out as the repository (``data/task1/raw``, ``data/task1/tok``) from the flat copy ``flat``."""
    for prefix in multi30k.PREFIXES.values():
        for lang in multi30k.LANGS:
            raw = root / multi30k.upstream_name(prefix, lang, "raw")
            tok = root / multi30k.upstream_name(prefix, lang, "tok")
            raw.parent.mkdir(parents=True, exist_ok=True)
            tok.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(flat / f"{prefix}.{lang}.gz", raw)
            with gzip.open(flat / "tok" / f"{prefix}.{lang}.gz", "rb") as source, open(tok, "wb") as target:
                shutil.copyfileobj(source, target)
    return root


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port just bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


class MirrorServer:
    """``with MirrorServer(root) as server``: ``server.url`` serves ``root``; ``corrupt`` and ``cut`` name files
    (paths under the root) to serve with one byte changed, or to stop half-way through; ``requests`` lists the paths
    asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corrupt: set[str] = set()
        self.cut: set[str] = set()
        self.requests: list[str] = []
        self.url = ""

    def __enter__(self) -> "MirrorServer":
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                name = self.path.lstrip("/")
                mirror.requests.append(name)
                path = mirror.root / name
                if not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                if name in mirror.corrupt:
                    middle = len(body) // 2
                    body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if name in mirror.cut:
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True  # the rest never comes
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
