"""An embedded PostgreSQL (binaries from PyPI via ``pgserver``) for the demo and the test suite.

Nothing here is used when a real database URL is configured.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.errors import ConfigError

INSTALL_HINT = "pip install 'fencebridge[embedded]'"


@dataclass
class EmbeddedPostgres:
    """A running embedded server; ``url`` connects over its Unix socket."""

    url: str
    data_dir: Path
    _server: Any
    #: the data directory was made by :func:`start` and goes with the server
    _owns_dir: bool = False

    def stop(self) -> None:
        self._server.cleanup()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start(data_dir: Path | None = None) -> EmbeddedPostgres:
    """Start (or join) an embedded server with its data in ``data_dir`` (a temp dir if None)."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset; it falls back fine.
            warnings.simplefilter("ignore")
            import pgserver  # noqa: PLC0415  (optional extra)
    except ImportError as exc:
        raise ConfigError(
            f"the embedded PostgreSQL needs the 'embedded' extra ({INSTALL_HINT}), "
            "or set FENCEBRIDGE_DATABASE_URL to use your own database"
        ) from exc
    directory = data_dir or Path(tempfile.mkdtemp(prefix="fencebridge-pg-"))
    directory.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(directory, cleanup_mode="stop")  # type: ignore[attr-defined]
    return EmbeddedPostgres(
        url=server.get_uri(), data_dir=directory, _server=server, _owns_dir=data_dir is None
    )


def binaries() -> Path:
    """Directory of the embedded PostgreSQL binaries (initdb, postgres, pg_ctl)."""
    try:
        from pgserver._commands import POSTGRES_BIN_PATH  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(f"the embedded PostgreSQL binaries need {INSTALL_HINT}") from exc
    return Path(POSTGRES_BIN_PATH)
