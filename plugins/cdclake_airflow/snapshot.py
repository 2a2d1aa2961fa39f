"""Following a Debezium snapshot from Airflow without holding a worker slot: a deferrable
sensor whose trigger reads the notification topic in the triggerer and logs progress."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


class SnapshotTrigger(BaseTrigger):
    """Reads notifications from the offsets taken before the signal was sent until the
    snapshot completes or aborts, or the deadline passes. Only the pipeline file's path
    is serialized: Kafka settings (and any secrets in them) are read where it runs."""

    def __init__(
        self,
        pipeline_path: str,
        signal_id: str,
        start: dict[str, int],
        blocking: bool,
        deadline: float,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow leaves it unannotated
        self.pipeline_path = pipeline_path
        self.signal_id = signal_id
        self.start = {str(k): int(v) for k, v in start.items()}
        self.blocking = blocking
        self.deadline = deadline  # epoch seconds, kept across triggerer restarts

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline_path": self.pipeline_path,
                "signal_id": self.signal_id,
                "start": self.start,
                "blocking": self.blocking,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from cdclake.pipeline_file import load_pipeline
        from cdclake_control.signals import (
            SnapshotProgress,
            notification_consumer,
            poll_notification,
        )

        pipeline = load_pipeline(self.pipeline_path)
        progress = SnapshotProgress(self.signal_id, blocking=self.blocking)
        start = {int(p): o for p, o in self.start.items()}
        consumer = await asyncio.to_thread(
            notification_consumer,
            pipeline.kafka,
            self.signal_id,
            pipeline.notification_topic,
            start,
        )
        try:
            while not progress.finished:
                if time.time() > self.deadline:
                    yield TriggerEvent({"status": "TIMEOUT", "progress": progress.to_dict()})
                    return
                note = await asyncio.to_thread(poll_notification, consumer, 1.0)
                line = progress.feed(note) if note else None
                if line:
                    self.log.info("snapshot %s: %s", self.signal_id, line)
        finally:
            await asyncio.to_thread(consumer.close)
        yield TriggerEvent({"status": progress.status, "progress": progress.to_dict()})


class SnapshotSensor(BaseSensorOperator):
    """Waits (deferred) for the snapshot sent by `signal_task`; fails when it aborts, a
    table's scan did not succeed, or the timeout passes."""

    def __init__(self, *, signal_task: str, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.signal_task = signal_task

    def execute(self, context: Context) -> dict[str, Any] | None:
        sent = context["ti"].xcom_pull(task_ids=self.signal_task)
        if not sent or not sent.get("follow"):
            self.log.info("nothing to follow for action %s", (sent or {}).get("action"))
            return None
        timeout_s = float(sent["timeout_s"])
        self.defer(
            trigger=SnapshotTrigger(
                pipeline_path=sent["pipeline_path"],
                signal_id=sent["signal_id"],
                start=sent["notification_offsets"],
                blocking=sent["blocking"],
                deadline=time.time() + timeout_s,
            ),
            method_name="execute_complete",
            timeout=dt.timedelta(seconds=timeout_s + 60),
        )
        return None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from cdclake_control.signals import SignalError, SnapshotProgress

        data = event["progress"]
        progress = SnapshotProgress(
            data["signal_id"],
            status=data["status"],
            chunks=data["chunks"],
            rows_scanned=data["rows_scanned"],
            tables=data["tables"],
        )
        if event["status"] == "TIMEOUT":
            raise SignalError(
                f"snapshot {progress.signal_id} did not finish in time (last status "
                f"{progress.status}, {progress.chunks} chunks); it may still be running: stop "
                "it with action=stop or wait and check the notification topic"
            )
        progress.check()
        self.log.info(
            "snapshot %s %s: %d chunks, rows scanned %s",
            progress.signal_id,
            progress.status,
            progress.chunks,
            progress.rows_scanned,
        )
        return progress.to_dict()
