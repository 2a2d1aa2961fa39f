#!/usr/bin/env bash
# The Spark Connect server of the compose topology: Spark's own long-lived driver on the
# standalone cluster, reached by the Airflow workers' loads (spark.connect_conn_id). Its
# guard (stack/spark-connect/ConnectGuard.java) takes calls carrying CDCLAKE_CONNECT_TOKEN
# from any address of the compose network; its port is never published.
set -euo pipefail
exec spark-submit \
  --master spark://spark-master:7077 \
  --properties-file /opt/spark-auth.conf \
  --class org.apache.spark.sql.connect.service.SparkConnectServer \
  --packages org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1,org.apache.iceberg:iceberg-aws-bundle:1.10.1 \
  --conf spark.driver.extraClassPath=/opt/connect/spark-connect_2.12-3.5.7.jar:/opt/connect/guard \
  --conf spark.connect.grpc.interceptor.classes=cdclake.ConnectGuard \
  --conf spark.connect.grpc.binding.port=15002 \
  --conf spark.sql.extensions=org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions \
  --conf spark.serializer=org.apache.spark.serializer.KryoSerializer \
  --conf spark.ui.enabled=false \
  --conf spark.driver.memory=4g \
  --conf spark.executor.memory=3g \
  --conf spark.pyspark.python=/usr/local/bin/python3 \
  spark-internal
