"""Event-driven loads: the Asset a pipeline's load DAG is scheduled on when its file sets
`watch:`, watched in the triggerer by the Kafka provider's MessageQueueTrigger.

The trigger only wakes the DAG: the run's offsets still come from each Iceberg table's
snapshot summary, never from the trigger. It consumes without committing (the connection
sets `enable.auto.commit` false), so each time it starts it waits at the end of the topics
for a record newer than itself: a backlog wakes the DAG once, not once per record. Airflow
queues at most one asset-triggered run behind the running one (`max_active_runs=1`), so a
burst of records never queues a burst of runs.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.triggers.msg_queue import KafkaMessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher
from cdclake.config import PipelineConfig

ARRIVED = "cdclake_airflow.watch.arrived"


def arrived(message: Any) -> dict[str, Any]:
    """The asset event's extra for the record that woke the DAG (any record does,
    tombstones included): where it is and its Kafka timestamp."""
    _kind, timestamp_ms = message.timestamp()
    return {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp_ms": timestamp_ms,
    }


def records_asset(pipeline: PipelineConfig) -> Asset:
    """The pipeline's records: an Asset whose watcher fires when one arrives on any of
    the pipeline's topics (listed tables, and a regex per pattern)."""
    assert pipeline.watch is not None
    server = pipeline.kafka.servers.split(",")[0].strip()
    trigger = KafkaMessageQueueTrigger(
        topics=pipeline.watched_topics(),
        kafka_config_id=pipeline.watch.conn_id,
        apply_function=ARRIVED,
        commit_offset=False,
    )
    name = f"cdclake__{pipeline.name}__records"
    return Asset(
        name=name,
        uri=f"kafka://{server}/{pipeline.topic_prefix}?pipeline={pipeline.name}",
        watchers=[AssetWatcher(name=name, trigger=trigger)],
    )
