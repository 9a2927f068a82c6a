"""`autotune dashboard`: optuna-dashboard on a study's storage and artifact folder, on the loopback by default."""
from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from autotune.errors import UserInputError
from autotune.redact import redact
from autotune.results.annotate import annotate_study, artifact_dir, artifact_store
from autotune.study.storage import load_existing_study, open_storage

__all__ = ["dashboard", "make_dashboard_server"]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass  # one line per request would bury the URL and the notes


def make_dashboard_server(storage_url: str, folder: Path, host: str, port: int) -> WSGIServer:
    """A WSGI server for optuna-dashboard (not yet serving): port 0 picks a free port (tests)."""
    from optuna_dashboard import wsgi

    app = wsgi(open_storage(storage_url), artifact_store=artifact_store(folder))
    try:
        return make_server(host, port, app, handler_class=_QuietHandler)
    except OSError as exc:
        raise UserInputError(f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port") from None


def _recipe_files(out: str, study_name: str) -> list[Path]:
    # Recipes are found by their provenance, so any file under the recipes folder may belong to this study.
    return sorted(Path(out).rglob("*.yaml")) if Path(out).is_dir() else []


def dashboard(args) -> int:
    study, url = load_existing_study(args.study, args.storage)
    folder = Path(args.artifacts) if args.artifacts else artifact_dir(url)
    if not args.no_annotate:
        annotate_study(study, _recipe_files(args.recipes, study.study_name), folder)
    server = make_dashboard_server(url, folder, args.host, args.port)
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host

    def stop(signum, frame) -> None:
        # SIGTERM ends it like Ctrl-C, and the socket is closed below. The exception alone is not enough: raised
        # while the app runs a request, wsgiref's handler catches it (logs it and serves on); the shutdown flag
        # then ends serve_forever's loop after that request. shutdown() waits for the loop, so it runs on a thread
        # of its own, not in this one's signal handler.
        threading.Thread(target=server.shutdown, daemon=True).start()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    print(f"optuna-dashboard for study {study.study_name} ({redact(url)}, artifacts in {folder})")
    print(f"open http://{shown}:{port}/dashboard  (Ctrl-C stops it)", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: anyone who can reach this machine can read and edit the study",
              file=sys.stderr)
    try:
        server.serve_forever()
        print("dashboard stopped", file=sys.stderr)
    except KeyboardInterrupt:
        print("dashboard stopped", file=sys.stderr)
    finally:
        server.server_close()
        signal.signal(signal.SIGTERM, previous)
    return 0
