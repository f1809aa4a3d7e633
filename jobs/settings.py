"""The example's settings, from the environment so scripts/example.sh and the end-to-end test share them."""

from __future__ import annotations

import os
from pathlib import Path

GROUP = os.environ.get("CLICKSTREAM_GROUP", "clickstream")
TOPIC = os.environ.get("CLICKSTREAM_TOPIC", "clicks")
PARTITIONS = int(os.environ.get("CLICKSTREAM_PARTITIONS", "8"))
MEMBERS = int(os.environ.get("CLICKSTREAM_MEMBERS", "3"))
BOOTSTRAP = os.environ.get("CLICKSTREAM_BOOTSTRAP", "127.0.0.1:9092")
HEARTBEAT_S = float(os.environ.get("CLICKSTREAM_HEARTBEAT_S", "5"))
SESSION_TIMEOUT_S = float(os.environ.get("CLICKSTREAM_SESSION_TIMEOUT_S", "20"))
MAX_RECORDS_PER_RUN = int(os.environ.get("CLICKSTREAM_MAX_RECORDS_PER_RUN", "100000"))
OUTPUT = Path(os.environ.get("CLICKSTREAM_OUTPUT", "output/clickstream")).resolve()
SPARK_MASTER = os.environ.get("CLICKSTREAM_SPARK_MASTER", "local[2]")
SPARK_REMOTE = os.environ.get("CLICKSTREAM_SPARK_REMOTE") or None
