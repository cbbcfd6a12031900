"""The parts of one simulated SGLang replica, wired together (one per app, no globals)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request

from spillgate.backends.sim.chat_template import ChatTemplate
from spillgate.backends.sim.clock import VirtualClock
from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.data_parallel import DataParallelScheduler, PublisherGroup, data_parallel_ranks
from spillgate.backends.sim.engine import Engine
from spillgate.backends.sim.kv_events import KvEventPublisher
from spillgate.backends.sim.metrics import ReplicaMetrics
from spillgate.backends.sim.scheduler import Scheduler
from spillgate.backends.sim.tokenizer import Tokenizer
from spillgate.backends.sim.vllm_metrics import VllmMetrics


class Replica:
    """Tokenizer, chat template, clock, scheduler, engine and metrics of one replica."""

    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        self.started_unix = time.time()
        self.tokenizer = Tokenizer()
        self.chat_template = ChatTemplate(self.tokenizer)
        self.clock = VirtualClock(config.time_scale)
        self.kv_events: KvEventPublisher | PublisherGroup | None
        """Opened and closed with the app (``server.create_app``); None without ``--kv-events-config``."""
        self.scheduler: Scheduler | DataParallelScheduler
        if config.dp_size > 1:
            self.scheduler, self.kv_events = data_parallel_ranks(config, self.clock)
        else:
            kv_events = config.kv_events
            publishes = kv_events is not None and kv_events.publishes
            self.kv_events = KvEventPublisher(kv_events, config.page_size) if kv_events and publishes else None
            self.scheduler = Scheduler(config.preset_spec, config.scheduler_limits(), self.clock, self.kv_events)
        self.metrics: ReplicaMetrics | VllmMetrics
        if config.engine == "vllm":
            self.metrics = VllmMetrics(
                model_name=config.served_model_name,
                stats=self.scheduler.stats,
                block_size=config.page_size,
                num_blocks=config.max_total_num_tokens // config.page_size,
            )
        else:
            self.metrics = ReplicaMetrics(
                model_name=config.served_model_name,
                stats=self.scheduler.stats,
                static_gauges={
                    "max_total_num_tokens": config.max_total_num_tokens,
                    "page_size": config.page_size,
                    "context_len": config.context_length,
                },
            )
        self.engine = Engine(config, self.scheduler, self.tokenizer, self.metrics)


def get_replica(request: Request) -> Replica:
    """FastAPI dependency: the replica the app was built for."""
    return request.app.state.replica


ReplicaDep = Annotated[Replica, Depends(get_replica)]
