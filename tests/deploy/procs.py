"""Real processes for the end-to-end tests: start one, collect its output lines, wait for a line with a
deadline (never a fixed sleep), stop it with SIGTERM (SIGKILL only past a deadline).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Callable

# Longest a started process may take to print what a test waits for (a server is up in well under a second).
START_DEADLINE_S = 20
# Longest a process may take to exit after SIGTERM (the server's shutdown grace is 8 s).
STOP_DEADLINE_S = 15


class Proc:
    """A started process whose stdout and stderr lines are collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None = None):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for_line(self, match: Callable[[str], bool], what: str, timeout: float = START_DEADLINE_S) -> str:
        """The first output line for which `match` holds; fails naming `what` (and showing the output)
        when the process exits or the deadline passes first."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if match(line):
                        return line
                seen = len(self.lines)
                exited = self.popen.poll() is not None and not self._reader.is_alive()
                left = deadline - time.monotonic()
                if exited or left <= 0:
                    why = f"exited with {self.popen.returncode}" if exited else f"not within {timeout} s"
                    raise AssertionError(f"{what}: {why}; output of {self.argv[:2]}:\n" + "\n".join(self.lines))
                self._changed.wait(min(left, 0.5))

    def wait_for_json(self, message: str, timeout: float = START_DEADLINE_S) -> dict:
        """The first JSON log line (tracing's JSON format) whose message is `message`, parsed."""
        line = self.wait_for_line(lambda l: json_message(l) == message, f"log line {message!r}", timeout)
        return json.loads(line)

    def stop(self) -> int:
        """SIGTERM, then wait; SIGKILL only when it outlives STOP_DEADLINE_S. Returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(STOP_DEADLINE_S)
        self._reader.join(STOP_DEADLINE_S)
        return self.popen.returncode

    def wait_exit(self, timeout: float = START_DEADLINE_S) -> int:
        """Waits for the process to exit on its own (fails past the deadline)."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.argv[:2]} still running after {timeout} s:\n{self.output()}")
        self._reader.join(STOP_DEADLINE_S)
        return code


def json_message(line: str) -> str | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return (record.get("fields") or {}).get("message") if isinstance(record, dict) else None


def wait_until(check: Callable[[], bool], what: str, timeout: float = START_DEADLINE_S, every: float = 0.1) -> None:
    """Polls `check` until it holds; fails naming `what` past the deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)
