"""A local driver's settings: no console progress bars, and the packaged log4j2 file ahead of the user's own
``extraJavaOptions`` (a later ``-D`` wins); a cluster's driver is left to Spark. The console itself is checked in the
wheel test's ``dg dev`` run (tests/packaging/wheel.py)."""

from __future__ import annotations

from pathlib import Path

from dagster_streamgroup.spark.session import LOG4J2_CONFIG, session_conf


def test_a_local_driver_logs_without_banners_or_progress_bars() -> None:
    conf = session_conf("local[1]")
    assert conf["spark.ui.showConsoleProgress"] == "false"
    option = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
    assert option in conf["spark.driver.extraJavaOptions"].split()
    text = Path(LOG4J2_CONFIG).read_text()
    assert "logger.native.name = org.apache.hadoop.util.NativeCodeLoader" in text
    assert "rootLogger.level = warn" in text


def test_the_users_own_log_settings_come_last() -> None:
    own = "-Dlog4j2.configurationFile=file:/etc/mine.properties"
    options = session_conf("local[1]", {"spark.driver.extraJavaOptions": own})["spark.driver.extraJavaOptions"]
    assert options.split()[-1] == own
    assert options.index(LOG4J2_CONFIG.as_uri()) < options.index(own)


def test_a_cluster_driver_is_left_to_spark() -> None:
    options = session_conf("spark://master:7077")["spark.driver.extraJavaOptions"]
    assert "log4j2.configurationFile" not in options
