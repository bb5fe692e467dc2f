"""``hami run --role node``: the node agent until SIGTERM/SIGINT, with a bounded shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from hami import config, log
from hami.backends.base import BackendError
from hami.kube.client import KubeConfigError
from hami.node.agent import NodeAgent

SHUTDOWN_TIMEOUT = 10.0

_log = log.get(__name__)


async def main(cfg: config.Config) -> int:
    if not cfg.node.name:
        print(
            "hami: the node role needs this node's name: set NODE_NAME (in a DaemonSet, from "
            "the downward API fieldRef spec.nodeName) or pass --node-name",
            file=sys.stderr,
        )
        return 2
    log.bind(role="node", node=cfg.node.name)
    agent = NodeAgent(cfg)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    run = asyncio.create_task(agent.run(), name="node-agent")
    stopper = asyncio.create_task(stop.wait(), name="signal")
    try:
        await asyncio.wait({run, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            _log.info("shutting_down", timeout=SHUTDOWN_TIMEOUT)
            agent.request_stop()
            done, _ = await asyncio.wait({run}, timeout=SHUTDOWN_TIMEOUT)
            if not done:
                _log.error("shutdown_timed_out", timeout=SHUTDOWN_TIMEOUT)
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
                return 1
        try:
            run.result()
        except (BackendError, config.ConfigError, KubeConfigError) as exc:
            _log.error("node_agent_failed", error=str(exc))
            return 2
        except BaseException as exc:
            _log.error("node_agent_failed", error=repr(exc), exc_info=True)
            return 1
        return 0
    finally:
        stopper.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
