"""The CDC rules, written once (`rules`, `fold`), and where a topic's changes are resolved
(`placement`): in the driver or in Spark tasks (`topic`), or range by range in the task
that read each Kafka partition's range (`ranges`, planned and checked by `range_plan`);
the resolved rows as Arrow tables (`rows`)."""
