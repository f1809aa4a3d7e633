"""``serve()``: the v3io-compatible server on uvicorn (httptools + uvloop), in the foreground until Ctrl-C.

Response header names keep their canonical case (:mod:`~dagster_streamgroup.local.v3io.wire`); uvicorn's
own ``date`` header is off because the application sends ``Date`` itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dagster_streamgroup.extras import missing_extra

try:
    import uvicorn
except ImportError as exc:
    raise missing_extra("uvicorn", "local", "the local v3io server (streamgroup local v3io)") from exc

from dagster_streamgroup.local.v3io.app import V3ioApp
from dagster_streamgroup.local.v3io.config import ServerConfig
from dagster_streamgroup.local.v3io.storage import Storage
from dagster_streamgroup.local.v3io.wire import CanonicalHeadersProtocol

log = logging.getLogger("dagster_streamgroup.local.v3io")

READY_MESSAGE = "v3io-compatible server listening on"


def serve(host: str, port: int, data_dir: Path, access_key: str | None, *, config: ServerConfig | None = None) -> None:
    """Serve until SIGINT/SIGTERM; every acknowledged write is committed to ``data_dir`` first."""
    config = config or ServerConfig.from_env(access_key)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = Storage(Path(data_dir), synchronous=config.synchronous)
    app = V3ioApp(store, config)
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=CanonicalHeadersProtocol,
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        timeout_keep_alive=120,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(uv_config)
    log.info(
        "%s http://%s:%d (data: %s, containers: %s, access key %s)",
        READY_MESSAGE,
        host,
        port,
        store.path,
        ",".join(config.containers),
        "required" if config.access_key is not None else "not checked",
    )
    try:
        server.run()
    finally:
        store.close()
