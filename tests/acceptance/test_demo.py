"""`fencebridge demo`, the README's first command, as a newcomer runs it, then explores it.

The exploration test reads the README's marked blocks and runs them as written: the demo with
``--keep`` in one process, each step in a shell of its own that sources the env file the demo
wrote, then Ctrl-C (a real SIGINT). Under each command the README shows what it prints, with
``...`` for what is left out; the test holds every command to that.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from bridge.identity import IDENTITY_KEY_ENV, IdentityHasher
from tests.support.pubsub_emulator import require_launcher

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: a deadline for a hung demo, not a timing assertion: a passing run needs a fraction of it
READ_SECONDS = 120.0
MARKER = "<!-- {name}"
TRY = "try, from another shell:"


def _env(**more: str) -> dict[str, str]:
    """The test's environment without the settings the demo's env file must provide."""
    dropped = ("FENCEBRIDGE_", "AWS_", "PUBSUB_EMULATOR_HOST")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    # The shell finds `fencebridge` where this interpreter's scripts are installed.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **more}


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _summary(stdout: str) -> dict[str, int]:
    rows = re.findall(r"^\s*(\S.*?)\s{2,}(\d+)$", stdout, re.MULTILINE)
    return {name.strip(): int(value) for name, value in rows}


def _assert_protocol_held(returncode: int, stdout: str, stderr: str) -> None:
    assert returncode == 0, stdout + stderr
    summary = _summary(stdout)
    assert summary["deliveries published"] == 27
    assert summary["new operations"] == 22
    assert summary["replays (nothing new)"] == 3
    assert summary["conflicts (rejected, nothing changed)"] == 1
    assert summary["quarantined (undecodable, kept with reason)"] == 1
    assert summary["stale writes fenced out"] >= 1
    assert summary["takeovers of an expired lease"] >= 1
    assert summary["charges in the provider's ledger"] == summary["work rows succeeded"] == 21
    assert summary["work rows quarantined (payload not readable)"] == 1
    assert "every charge operation charged exactly once (21 charges, 0 twice)" in stdout
    assert "Traceback" not in stderr


def _assert_counts_agree(stdout: str) -> None:
    """The operations announced on publishing are the new operations the summary counts."""
    published = re.search(r"^published (\d+) deliveries for (\d+) operations", stdout, re.M)
    assert published is not None, stdout
    summary = _summary(stdout)
    assert int(published[1]) == summary["deliveries published"]
    assert int(published[2]) == summary["new operations"]


# -- the README's transcripts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    command: str
    #: what the README shows under the command; "..." lines and inline "..." elide output
    shown: list[str]


def _block(name: str) -> list[str]:
    """The lines of the fenced block right after the README's ``<!-- name`` marker."""
    lines = README.read_text(encoding="utf-8").splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(MARKER.format(name=name))]
    assert lines[at + 1].startswith("```"), f"no fenced block after the {name} marker"
    end = next(i for i in range(at + 2, len(lines)) if lines[i].startswith("```"))
    return lines[at + 2 : end]


def _steps(name: str) -> list[Step]:
    steps: list[Step] = []
    for line in _block(name):
        if line.startswith("$ "):
            steps.append(Step(line[2:], []))
        else:
            assert steps, f"{name}: output before the first command"
            steps[-1].shown.append(line)
    return steps


def _normal(line: str) -> str:
    return " ".join(line.split())


def _pattern(shown: list[str]) -> re.Pattern[str]:
    """Shown lines in order; a ``...`` line skips any lines, ``...`` in a line any text."""
    parts = []
    for line in shown:
        text = _normal(line)
        if text == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*".join(re.escape(p) for p in text.split("...")) + "\n")
    return re.compile("".join(parts))


def _shows(shown: list[str], output: str) -> bool:
    text = "".join(_normal(line) + "\n" for line in output.splitlines())
    return _pattern(shown).fullmatch(text) is not None


def test_the_transcript_matcher_holds_lines_in_order_and_elides_only_where_shown() -> None:
    output = "a  b\nnoise\nc 1 d\n"
    assert _shows(["a b", "...", "c ... d"], output)
    assert not _shows(["a b", "c ... d"], output)  # no "...": the noise line must be shown
    assert not _shows(["...", "c 2 d"], output)
    assert not _shows(["c ... d", "...", "a b"], output)  # order counts
    assert _shows(["...", "c 1 d"], output)


# -- the demo, kept running ------------------------------------------------------------------------


class KeptDemo:
    """``fencebridge demo --keep`` as a process whose stdout is read line by line."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            shlex.split(command),
            cwd=cwd,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its embedded PostgreSQL goes with it if the test fails
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def read_line(self) -> str:
        """The next line of stdout; fails the test if the demo ends or hangs first."""
        try:
            line = self._queue.get(timeout=READ_SECONDS)
        except queue.Empty:
            pytest.fail("the demo printed nothing more:\n" + "\n".join(self.lines))
        if line is None:
            pytest.fail(f"the demo ended: {self.finish()}\n" + "\n".join(self.lines))
        self.lines.append(line)
        return line

    def read_until_commands(self, count: int) -> list[str]:
        """Lines up to the printed commands; returns those ``count`` commands."""
        while TRY not in self.lines or len(self.lines) - self.lines.index(TRY) - 1 < count:
            self.read_line()
        start = self.lines.index(TRY) + 1
        return [line.strip() for line in self.lines[start : start + count]]

    def stop(self, signum: signal.Signals) -> tuple[int, str, str]:
        """Send ``signum`` (Ctrl-C is SIGINT) and wait for the demo to stop by itself."""
        self.proc.send_signal(signum)
        return self.finish()

    def finish(self) -> tuple[int, str, str]:
        returncode = self.proc.wait(timeout=READ_SECONDS)
        while (line := self._queue.get(timeout=READ_SECONDS)) is not None:
            self.lines.append(line)
        assert self.proc.stderr is not None
        return returncode, "\n".join(self.lines) + "\n", self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[tuple[KeptDemo, Step]]:
    (start,) = _steps("demo-keep")
    demo = KeptDemo(start.command, tmp_path)
    try:
        yield demo, start
    finally:
        demo.close()


def _env_file(path: Path) -> dict[str, str]:
    """The ``export NAME=value`` lines of the demo's env file, as a shell would read them."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            (assignment,) = shlex.split(line.removeprefix("export "))
            name, value = assignment.split("=", 1)
            values[name] = value
    return values


def _database_url(env_file: Path) -> str:
    return _env_file(env_file)["FENCEBRIDGE_DATABASE_URL"]


def _charged_under_the_env_files_key(
    env_file: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[set[str], set[str]]:
    """The provider's charged keys, and the keys the env file's identity key derives."""
    values = _env_file(env_file)
    url = values["FENCEBRIDGE_DEMO_PROVIDER_URL"] + "/_ledger"
    with urllib.request.urlopen(url, timeout=READ_SECONDS) as response:
        charged = {c["idempotency_key"] for c in json.loads(response.read())}
    monkeypatch.setenv(IDENTITY_KEY_ENV, values[IDENTITY_KEY_ENV])
    hasher = IdentityHasher.from_env()
    operations = [(t, f"order-{i}") for t in ("acme", "globex") for i in range(1, 11)]
    derived = {hasher.idempotency_key(t, o) for t, o in [*operations, ("acme", "order-stall")]}
    return charged, derived


@pytest.mark.slow
def test_the_readme_exploration_runs_as_written_against_demo_keep(
    kept: tuple[KeptDemo, Step], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo, start = kept
    assert start.command == "fencebridge demo --keep --dir demo-run"
    steps = _steps("demo-exploration")
    source = steps[0]
    assert source.command == ". demo-run/demo.env"
    assert not source.shown

    printed = demo.read_until_commands(len(steps))
    directory = tmp_path / "demo-run"
    # What the demo prints is the README's steps, with the directory spelled out.
    assert printed == [s.command.replace("demo-run", str(directory)) for s in steps]
    assert (directory / "bridge.toml").is_file()
    assert (directory / "demo.env").stat().st_mode & 0o077 == 0  # it holds the identity key
    # The env file's key is the one the demo charged under: it derives the provider's keys.
    charged, derived = _charged_under_the_env_files_key(directory / "demo.env", monkeypatch)
    assert len(charged) == 21
    assert charged == derived

    for step in steps[1:]:
        result = subprocess.run(
            ["bash", "-c", f"set -e\n{source.command}\n{step.command}"],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=READ_SECONDS,
            check=False,
        )
        assert result.returncode == 0, f"$ {step.command}\n{result.stdout}{result.stderr}"
        assert _shows(step.shown, result.stdout), f"$ {step.command}\n{result.stdout}"

    returncode, stdout, stderr = demo.stop(signal.SIGINT)
    assert _shows(start.shown, stdout), stdout
    _assert_protocol_held(returncode, stdout, stderr)
    _assert_counts_agree(stdout)
    # Stopped cleanly: the database is gone, the files the operator asked for stay.
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(_database_url(directory / "demo.env"), connect_timeout=5).close()
    assert (directory / "bridge.toml").is_file()


@pytest.mark.slow
def test_demo_keep_without_a_directory_stops_on_sigterm_and_removes_its_own(
    tmp_path: Path,
) -> None:
    demo = KeptDemo("fencebridge demo --keep", tmp_path)
    try:
        printed = demo.read_until_commands(1)
        (env_file,) = re.findall(r"^\. (\S+)$", printed[0], re.M)
        directory = Path(env_file).parent
        assert directory.is_dir()
        assert directory.name.startswith("fencebridge-demo-")
        returncode, stdout, stderr = demo.stop(signal.SIGTERM)
    finally:
        demo.close()
    _assert_protocol_held(returncode, stdout, stderr)
    assert not directory.exists()


@pytest.mark.slow
def test_a_signal_before_the_demo_settles_stops_everything_and_fails(tmp_path: Path) -> None:
    demo = KeptDemo("fencebridge demo --keep --dir demo-run", tmp_path)
    try:
        while not demo.read_line().startswith("published "):
            pass
        returncode, stdout, _ = demo.stop(signal.SIGTERM)
    finally:
        demo.close()
    assert returncode == 128 + signal.SIGTERM, stdout
    assert "stopped by SIGTERM before the demo settled" in stdout
    assert TRY not in stdout
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(
            _database_url(tmp_path / "demo-run" / "demo.env"), connect_timeout=5
        ).close()


@pytest.mark.slow
def test_dir_without_keep_is_refused_with_what_to_do(tmp_path: Path) -> None:
    result = _demo("--dir", str(tmp_path / "demo-run"))
    assert result.returncode == 2
    assert "--dir names where --keep writes its files: add --keep, or drop --dir" in result.stderr
    assert not (tmp_path / "demo-run").exists()


def test_a_dir_that_is_a_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    result = _demo("--keep", "--dir", str(taken))
    assert result.returncode == 1
    assert "exists and is not a directory; name a directory" in result.stderr
    assert "starting:" not in result.stdout


@pytest.mark.slow
def test_the_demo_shows_the_protocol_on_pubsub() -> None:
    require_launcher()
    result = _demo("--broker", "pubsub")
    _assert_protocol_held(result.returncode, result.stdout, result.stderr)
    _assert_counts_agree(result.stdout)


@pytest.mark.slow
def test_the_pubsub_demo_says_how_to_get_the_emulator_when_it_is_missing() -> None:
    result = _demo("--broker", "pubsub", env={"FENCEBRIDGE_PUBSUB_EMULATOR": "/nonexistent"})
    assert result.returncode == 1
    assert "gcloud components install pubsub-emulator" in result.stderr
    assert "Traceback" not in result.stderr
