"""``fencebridge demo --keep``: the files and commands that let a shell reach the running demo.

The demo's services live only as long as its process, on ports and a socket nobody chose, under
an identity key it made up. Without them written down, no operator command can find the
database or read the hashes it prints. So the demo writes the configuration it runs
(``bridge.toml``) and a shell env file (``demo.env``: the database URL, the identity key, the
provider's URL and the broker's settings) into one directory, and prints the commands to try.
The commands are the README's exploration steps, with this directory in them (an acceptance
test holds the two together).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import ConfigError

CONFIG_FILE = "bridge.toml"
ENV_FILE = "demo.env"


@dataclass(frozen=True, slots=True)
class Workspace:
    """Where the demo wrote its files; ``owned`` when the demo made the directory itself."""

    directory: Path
    owned: bool

    @property
    def config(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def env(self) -> Path:
        return self.directory / ENV_FILE


def workspace(directory: Path | None) -> Workspace:
    """The directory to write into: the one given (created if missing), or a fresh temp dir."""
    if directory is None:
        return Workspace(Path(tempfile.mkdtemp(prefix="fencebridge-demo-")).resolve(), owned=True)
    path = directory.expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--dir {directory}: exists and is not a directory; name a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--dir {directory}: cannot be created ({exc.strerror or exc}); name a directory "
            "you can write to"
        ) from exc
    return Workspace(path, owned=False)


def env_text(values: Mapping[str, str]) -> str:
    """``export NAME=value`` lines a POSIX shell can source; every value quoted."""
    lines = ["# fencebridge demo: source this file (. demo.env), then run fencebridge commands"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def write(space: Workspace, config_text: str, env: Mapping[str, str]) -> None:
    """Write both files; the env file holds the identity key, so only its owner may read it."""
    try:
        space.config.write_text(config_text, encoding="utf-8")
        descriptor = os.open(space.env, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(env_text(env))
        space.env.chmod(0o600)  # an existing file keeps its mode through O_CREAT
    except OSError as exc:
        raise ConfigError(
            f"cannot write the demo's files into {space.directory}: {exc.strerror or exc}; "
            "pass --dir with a directory you can write to"
        ) from exc


def commands(directory: str) -> list[str]:
    """The exploration steps, for a shell in which ``directory`` names the demo's files."""
    config = shlex.quote(f"{directory}/{CONFIG_FILE}")
    return [
        f". {shlex.quote(f'{directory}/{ENV_FILE}')}",
        "fencebridge status",
        "fencebridge inspect acme order-stall",
        "fencebridge inspect globex order-5",
        "fencebridge inspect acme order-x",
        f'fencebridge redrive --config {config} --reason "a first look" --dry-run',
        f"fencebridge check --config {config}",
    ]


def lines(space: Workspace, services: Sequence[tuple[str, str]]) -> list[str]:
    """What ``--keep`` prints once the demo has settled: where things are, what to try."""
    width = max(len(name) for name, _ in services)
    out = ["running until Ctrl-C (SIGINT or SIGTERM stops everything and exits 0):"]
    out += [f"  {name:<{width}}  {value}" for name, value in services]
    out += [
        f"  {'files':<{width}}  {space.directory}",
        f"  {'':<{width}}    {CONFIG_FILE}  the configuration the demo runs",
        f"  {'':<{width}}    {ENV_FILE}     database URL, identity key, endpoints",
        "",
        "try, from another shell:",
    ]
    out += [f"  {command}" for command in commands(str(space.directory))]
    out += ["", "the console, from another shell (log in with the token after you:operator:):"]
    out += [f"  {command}" for command in console_commands(str(space.directory))]
    return out


def console_commands(directory: str) -> list[str]:
    """How to start ``fencebridge console`` against the demo's database, with a fresh token."""
    return [
        f". {shlex.quote(f'{directory}/{ENV_FILE}')}",
        'export FENCEBRIDGE_CONSOLE_TOKENS="you:operator:$(openssl rand -hex 16)"',
        'echo "$FENCEBRIDGE_CONSOLE_TOKENS"',
        f"fencebridge console --config {shlex.quote(f'{directory}/{CONFIG_FILE}')}",
        "# then open http://127.0.0.1:8091/login",
    ]
