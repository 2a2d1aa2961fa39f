"""The lake's Iceberg tables: creating and evolving them (`tables`), the MERGE's SQL
(`merge_sql`), a batch's write with its offsets in the same commit (`write`), the catalog
read from outside Spark (`catalog`), maintenance (which also removes what killed loads
left), and the dead-letter table."""
