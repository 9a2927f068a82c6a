"""The HTTP server: uvicorn serving the FastAPI app on an event loop of its own thread, so that the engine loop
keeps the thread that built the engine (autotune/serve/engine_loop.py says why that matters on the CPU)."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from autotune.serve.api import ServingApp, create_app
from autotune.serve.guard import Access, allowed_hosts, protocol_class

__all__ = ["ServingServer"]

# Many clients connect at once: the engine loop's queue, not the listen backlog, bounds the work.
_BACKLOG = 2048
# Seconds a stopping server gives requests in flight (the engine loop, stopped first, has already failed them).
_GRACE_S = 5


class ServingServer:
    """Listens on construction (port 0 picks a free port: `server_address`); start() serves HTTP on a thread of
    its own, stop() ends the engine loop and then HTTP."""

    def __init__(self, address: tuple[str, int], app: ServingApp, access: Access | None = None) -> None:
        host, port = address
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        # Bound here, not by uvicorn, so that a taken port is an OSError to the caller and port 0 is known at once.
        self._socket = socket.create_server((host, port), family=family, backlog=_BACKLOG)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self.app, self.access = app, access or Access()
        # The Host names served: the local ones, the address bound, and those the operator added.
        hosts = allowed_hosts(host, self.access.allowed_hosts)
        config = uvicorn.Config(create_app(app, self.access, hosts), lifespan="off", log_config=None,
                                log_level="warning", access_log=False, timeout_graceful_shutdown=_GRACE_S,
                                limit_concurrency=self.access.max_connections,
                                http=protocol_class(self.access, app.metrics.refuse))
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        """Serve HTTP on a background thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._socket]},
                                        name="autotune-http", daemon=True)
        self._thread.start()
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP server failed to start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop the engine loop (requests in flight end with an error) and then HTTP; idempotent."""
        self.app.engine_loop.stop()
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=_GRACE_S + 5)
        self._socket.close()
        self.app.parser.shutdown(wait=False, cancel_futures=True)
