"""PySpark Python Data Sources that read exact offset ranges of a stream as DataFrames."""
