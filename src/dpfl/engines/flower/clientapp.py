"""A warm ClientApp process for a SuperNode in Flower's `process` isolation mode.

By default (`subprocess` isolation) a SuperNode starts a SuperExec that starts a new
`flwr-clientapp` process for every message, which imports Flower, torch and dpfl and
reads the study before it can answer: seconds a message on a small machine. With
`flower-supernode --isolation process` the SuperNode starts nothing and leaves its tasks
on its local Runtime API for an executor outside it; Flower 1.42's own (`flower-superexec`)
still starts one one-shot `flwr-clientapp` a task. This process is that executor and that
ClientApp at once: it claims each task as `flower-superexec` does (AcquireTask, the task's
token) and runs it as `flwr-clientapp` does (Flower's own `pull_task_input`,
`push_message` and `push_task_output`, a task heartbeat meanwhile), in this one process,
so imports, the loaded app and dpfl's memoised accounting stay warm between messages.

`dpfl deploy hospital` starts it beside its SuperNode and ends both together
(`dpfl.cli.processes`). The app is the one the run's FAB names, installed and loaded by
Flower's own functions once per FAB; a task that fails is answered with Flower's error
reply, as `flwr-clientapp` answers it, and the process goes on with the next.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import time

from flwr.app import Error, Message
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

log = logging.getLogger("flwr")

POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Flower's variable for how often a SuperExec asks for a task; this process honours it."""
POLL_SECONDS = 0.1
"""Seconds between two asks for a task when idle (Flower's SuperExec: 1 s by default)."""


def _client(address: str, *interceptors: RuntimeTokenHttpInterceptor) -> RuntimeHttpClient:
    """A client of the SuperNode's local Runtime API (plain HTTP on loopback, as the
    SuperNode serves it when not given a certificate)."""
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            *interceptors,
        ],
        retry_invoker=make_simple_http_retry_invoker(),
    )


class Worker:
    """Claims the SuperNode's ClientApp tasks one at a time and runs each here."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.apps: dict[str, ClientApp] = {}
        """The loaded ClientApp of each FAB (by hash) this process ran."""

    def app(self, fab_id: str, fab_version: str, fab_hash: str, content: bytes) -> ClientApp:
        """The FAB's ClientApp, installed and loaded by Flower the first time."""
        if fab_hash not in self.apps:
            install_from_fab(content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            self.apps[fab_hash] = load(fab_id, fab_version, fab_hash)
        return self.apps[fab_hash]

    def serve(self, poll: float) -> None:
        """Ask for a task every `poll` seconds while idle; run each one claimed."""
        tasks = _client(self.address)
        ask = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        while True:
            claimed = tasks.AcquireTask(ask)
            if claimed.HasField("task") and claimed.token:
                self.run(claimed.token)
            else:
                time.sleep(poll)

    def run(self, token: str) -> None:
        """One task, as `flwr-clientapp` runs it: its input pulled, the app's reply (or
        an error reply) pushed, its status and context pushed last."""
        client = _client(self.address, RuntimeTokenHttpInterceptor(token))
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        context, status, details = None, SubStatus.FAILED, "the ClientApp task failed"
        try:
            message, context, run, fab = pull_task_input(client)
            try:
                app = self.app(run.fab_id, run.fab_version, fab.hash_str, fab.content)
                reply = app(message=message, context=context)
                status, details = SubStatus.COMPLETED, ""
            except Exception as exc:  # answered as flwr-clientapp answers it
                log.exception("ClientApp raised an exception")
                load = isinstance(exc, LoadClientAppError)
                code = (
                    ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                    if load
                    else ErrorCode.CLIENT_APP_RAISED_EXCEPTION
                )
                details = f"{type(exc)}:<'{exc}'>"
                reply = Message(Error(code=code, reason=details), reply_to=message)
            push_message(client, reply, context)
        except Exception:  # the SuperNode lost the task: it expires there, go on
            log.exception("a ClientApp task could not be run")
        finally:
            push_task_output(client, context, status, details)
            heartbeat.stop()
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's HOST:PORT")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = parser.parse_args()
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    # loaded now, while the SuperNode connects, not when the first message (a hello the
    # server waits on) arrives: the hospital half and torch, most of the app's imports
    importlib.import_module("dpfl.engines.flower.hospital")
    Worker(args.runtime_api_address).serve(float(os.environ.get(POLL_ENV, POLL_SECONDS)))


if __name__ == "__main__":
    main()
