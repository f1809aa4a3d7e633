"""The names the secrets test's code location and the test share: environment variables, a file name, users, assets.
Apart from ``definitions.py`` so the test reads them without loading the definitions (their environment is the
deployment's, set only for ``dagster dev``)."""

SASL_USERNAME = "clickstream-svc"
SASL_PASSWORD_FILE = "sasl-password"
"""The password file's name inside the mounted secret directory."""
SECRET_PATH_ENV = "CLICKSTREAM_SECRET_PATH"
STORE_URL_ENV = "CLICKSTREAM_STORE_URL"
SSL_CA_ENV = "CLICKSTREAM_SSL_CA"
"""The CA that signed the broker's certificate: a path, not a secret."""
V3IO_KEY_ENV = "V3IO_ACCESS_KEY"
V3IO_ASSET = "page_views_per_minute_v3io"
COMPONENT_GROUP_ENV = "CLICKSTREAM_YAML_GROUP"
COMPONENT_TOPIC_ENV = "CLICKSTREAM_YAML_TOPIC"
COMPONENT_PASSWORD_ENV = "CLICKSTREAM_YAML_SASL_PASSWORD"
COMPONENT_ASSET = "clicks_yaml"
