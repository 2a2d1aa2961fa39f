"""Kafka as the loader reads it: topics' partitions and watermarks (`topics`), exact
offset ranges read (`reader`) into raw rows (`raw_rows`), and what one pass over them
tells (`scan`)."""
