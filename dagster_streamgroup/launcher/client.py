"""The launcher's side of one fork server process: start it, ask it to fork, notice when it is gone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

from dagster_streamgroup.launcher.child import RESTORE_ENV
from dagster_streamgroup.launcher.fingerprint import Fingerprint
from dagster_streamgroup.launcher.protocol import (
    Channel,
    ChannelClosedError,
    Exited,
    Fork,
    Forked,
    Message,
    Preload,
    PreloadFailed,
    Ready,
    Refused,
    Release,
    Released,
)

ARROW_MALLOC_CONF = "JE_ARROW_MALLOC_CONF"
"""PyArrow's bundled jemalloc starts a background thread at import unless told not to; the server must have
none when it forks. Children get the variable back as it was (it only matters at jemalloc's start)."""
REPLY_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0


class ForkServerUnavailableError(Exception):
    """The fork server cannot start this run; the message says why (it goes into the run's event log)."""

    def __init__(self, message: str, fingerprint: Fingerprint | None = None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint or Fingerprint()
        """The files a failed preload had loaded: a change to one of them is worth another try."""


class StartUnconfirmedError(Exception):
    """The child was told to start the run, and the server did not confirm it (it did not answer, or ended):
    the run may be running in that child. It is never started a second time (both would run it, and a range
    commit it could make twice); run monitoring fails it if it did not start."""

    def __init__(self, forked: Forked, reason: str) -> None:
        super().__init__(reason)
        self.forked = forked


def server_environment(executable: str, base: Mapping[str, str]) -> dict[str, str]:
    """The code server's environment for ``executable`` (its venv's bin first on PATH, as Dagster does),
    plus what the fork server alone needs."""
    env = dict(base)
    if executable != sys.executable and os.path.exists(os.path.join(os.path.dirname(executable), "activate")):
        env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(executable), env.get("PATH")) if p)
    original = env.get(ARROW_MALLOC_CONF)
    env[ARROW_MALLOC_CONF] = f"{original},background_thread:false" if original else "background_thread:false"
    env[RESTORE_ENV] = json.dumps({ARROW_MALLOC_CONF: original})
    return env


class ForkServerHandle:
    """One running fork server. Requests are serialized: a fork is a few milliseconds."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: Channel, ready: Ready, generation: str | None) -> None:
        self.proc = proc
        self.channel = channel
        self.ready = ready
        self.generation = generation
        self.exits: dict[int, int] = {}
        """Exit statuses of children this server has waited for, by PID."""
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, preload: Preload, executable: str, generation: str | None, timeout_s: float) -> ForkServerHandle:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [executable, "-m", "dagster_streamgroup.launcher.forkserver", "--fd", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=server_environment(executable, os.environ),
            )
        except OSError as exc:
            ours.close()
            raise ForkServerUnavailableError(f"the fork server could not be started with {executable}: {exc}") from exc
        finally:
            theirs.close()
        channel = Channel(ours)
        closed = False
        try:
            channel.send(preload)
            reply = channel.recv(timeout_s)
        except ChannelClosedError:
            reply, closed = None, True
        if isinstance(reply, Ready):
            return cls(proc, channel, reply, generation)
        timed_out = reply is None and not closed
        channel.close()
        if timed_out:
            proc.kill()
        _stop(proc)
        if isinstance(reply, PreloadFailed):
            raise ForkServerUnavailableError(
                f"the fork server's preload failed: {reply.error.strip()}", reply.fingerprint
            )
        if timed_out:
            raise ForkServerUnavailableError(f"the fork server's preload took longer than {timeout_s:g} s")
        raise ForkServerUnavailableError(
            f"the fork server exited with {proc.returncode} before it was ready (its stderr is the launcher's)"
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, fork: Fork, before_start: Callable[[Forked], None]) -> Forked:
        """Fork a child for the run, call ``before_start`` (which tags the run), then let the child start.
        If ``before_start`` raises, the child exits without touching the run."""
        with self._lock:
            self.channel.send(fork)
            forked = self._answer()
            if isinstance(forked, Refused):
                raise ForkServerUnavailableError(f"the fork server refused to fork: {forked.reason}")
            if not isinstance(forked, Forked):
                self._out_of_turn(forked, "a fork")
            try:
                before_start(forked)
            except BaseException:
                self._release(forked.pid, start=False)
                raise
            try:
                released = self._release(forked.pid, start=True)
            except (ChannelClosedError, ForkServerUnavailableError) as exc:
                raise StartUnconfirmedError(forked, str(exc) or type(exc).__name__) from exc
            if isinstance(released, Refused):  # its child is gone: the go-ahead was never given
                raise ForkServerUnavailableError(f"the fork server did not release child {forked.pid}: {released}")
            return forked

    def _release(self, pid: int, *, start: bool) -> Released | Refused:
        """Tell the server to let child ``pid`` start its run (or exit without it); its answer."""
        self.channel.send(Release(pid=pid, start=start))
        answer = self._answer()
        if not isinstance(answer, (Released, Refused)):
            self._out_of_turn(answer, f"the release of child {pid}")
        return answer

    def _answer(self) -> Message:
        """The server's answer to the request just sent. A server that does not answer in time is closed: its
        answer could still come, and be taken for the answer to the next request (a run tagged with, and
        releasing, the child forked for another run). Closing it kills the children it has not released; the
        pool starts another server for the next run."""
        try:
            return self._reply()
        except ForkServerUnavailableError:
            self._abandon()
            raise

    def _out_of_turn(self, message: Message, request: str) -> NoReturn:
        """An answer that is not one to the request: the requests and answers are out of step; closed, as above."""
        self._abandon()
        raise ForkServerUnavailableError(f"the fork server answered {message.type} to {request}")

    def _abandon(self) -> None:
        self.channel.close()
        _stop(self.proc)

    def collect_exits(self, timeout_s: float = 0.0) -> None:
        """Take in the exit notices the server sent since the last request (waiting up to ``timeout_s`` for
        one, and for a launch in progress to finish its request)."""
        if not self._lock.acquire(timeout=max(timeout_s, REPLY_TIMEOUT_S)):
            return
        try:
            wait = timeout_s
            while True:
                message = self.channel.recv(timeout_s=wait)
                wait = 0.0
                if message is None:
                    return
                if isinstance(message, Exited):
                    self.exits[message.pid] = message.status
        except ChannelClosedError:
            return
        finally:
            self._lock.release()

    def _reply(self) -> Message:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            message = self.channel.recv(max(0.0, deadline - time.monotonic()))
            if message is None:
                raise ForkServerUnavailableError(f"the fork server did not answer within {REPLY_TIMEOUT_S:g} s")
            if isinstance(message, Exited):
                self.exits[message.pid] = message.status
                continue
            return message

    def close(self) -> None:
        """Close the channel: the server exits; the runs it released keep running."""
        with self._lock:
            self.channel.close()
        _stop(self.proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
