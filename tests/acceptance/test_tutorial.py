"""docs/tutorial.md as written: its files are written as the page shows them, and its commands
run against a real PostgreSQL (the fixture the package ships), from a directory of their own."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from bridge.testing import TEST_DATABASE_URL_ENV

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"
FILE = re.compile(r"<!-- tutorial-file: (\S+) -->\n```python\n(.*?)```", re.DOTALL)
RUN = re.compile(r"<!-- tutorial-run -->\n```bash\n(.*?)```", re.DOTALL)


@pytest.mark.slow
def test_the_pages_handler_tests_pass_as_written(tmp_path: Path, pg_admin_url: str) -> None:
    page = PAGE.read_text(encoding="utf-8")
    files = FILE.findall(page)
    assert {name for name, _ in files} == {
        "refunds.py",
        "ledger.py",
        "test_handlers.py",
        "publish.py",
    }
    for name, text in files:
        (tmp_path / name).write_text(text, encoding="utf-8")
    # a team's handler test is three lines: the fixture, `run`, what the row shows
    first = dict(files)["test_handlers.py"].split("\n\n\ndef ")[1].splitlines()
    assert len([line for line in first if line.strip()]) == 3, first
    (command,) = RUN.findall(page)
    argv = command.split()
    assert argv[:3] == ["python", "-m", "pytest"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[TEST_DATABASE_URL_ENV] = pg_admin_url
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


SHELL = re.compile(r"<!-- tutorial-shell -->\n```bash\n(.*?)```", re.DOTALL)


def read_env(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        found[name] = value
    return found


@pytest.mark.slow
def test_the_pages_local_bridge_runs_as_written(tmp_path: Path) -> None:
    """Step 4's commands, one by one as the page gives them (``&`` a process left running,
    ``. file`` the environment it exports), then the refund the producer sent, succeeded."""
    page = PAGE.read_text(encoding="utf-8")
    for name, text in FILE.findall(page):
        (tmp_path / name).write_text(text, encoding="utf-8")
    (block,) = SHELL.findall(page)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG", "AWS"))}
    env.pop("PUBSUB_EMULATOR_HOST", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    running: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    status = ""
    try:
        for line in block.strip().splitlines():
            words = shlex.split(line)
            if words[0] == ".":
                env.update(wait_for_env(tmp_path / words[1], running[0]))
                continue
            extra = {}
            while "=" in words[0]:
                name, _, value = words.pop(0).partition("=")
                extra[name] = value
            background = words[-1] == "&"
            argv = words[:-1] if background else words
            if background:
                log = (tmp_path / f"{argv[0]}-{len(running)}.log").open("wb")
                logs.append(log)
                running.append(
                    subprocess.Popen(
                        argv, cwd=tmp_path, env={**env, **extra}, stdout=log, stderr=log
                    )
                )
                continue
            if argv[0] == "fencebridge" and argv[1] == "status":
                status = eventually_succeeded(argv, tmp_path, {**env, **extra})
                continue
            done = subprocess.run(
                argv,
                cwd=tmp_path,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
    finally:
        for process in reversed(running):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        for log in logs:
            log.close()
    assert status, "status never showed the refund succeeded"
    assert all(p.returncode == 0 for p in running), [p.returncode for p in running]


def wait_for_env(path: Path, local: subprocess.Popen[bytes]) -> dict[str, str]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert local.poll() is None, "fencebridge demo --local ended"
        if path.exists() and (path.parent / "bridge.toml").exists():
            return read_env(path)
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written")


def eventually_succeeded(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = subprocess.run(
            [*argv, "--json"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0 and json.loads(done.stdout)["totals"]["succeeded"] == 1:
            return done.stdout
        time.sleep(0.5)
    return ""
