"""Kafka as the loader reads it: topics' partitions and watermarks (`topics`), exact
offset ranges read into raw rows (`reader`), and what one pass over them tells (`scan`)."""
