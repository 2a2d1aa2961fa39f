"""Debezium's records as the loader reads them: Connect schemas and their lake types
(`connect`), a topic's unified shape (`schema`), and the JSON-with-schema wire format,
records to changes (`json_records`) and values to lake values (`json_values`)."""
