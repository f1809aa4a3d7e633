#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine with Python 3.11: uv (in .tools/),
# the locked virtualenv (.venv/: the package with its extras [local] and [postgres] and the dev group, which
# names them; PYTHON picks another supported interpreter, 3.11-3.14), Apache Kafka's broker and tools (jars from Maven Central, pinned by
# kafka/pom.xml and checked against kafka/jars.sha256, in .tools/), Spark's own Kafka source for the
# pinned Spark (spark_kafka/pom.xml, checked against spark_kafka/jars.sha256), Spark's Avro functions (spark_formats/),
# the local Schema Registry (Apicurio Registry's runnable application, registry/pom.xml, its archive and every unpacked
# file checked against registry/*.sha256; it runs on a Java 21+, found or named here), and, when run as root, Java 17, Maven
# and PostgreSQL from Debian's packages if they are missing. Safe to run again: each step is skipped when
# already done (a second run fetches nothing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.8

apt_ready=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup: $1 is missing and this user is not root; install it (Debian: apt-get install $2)" >&2
    return 1
  fi
  if [ "$apt_ready" = 0 ]; then apt-get update -qq; apt_ready=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

if [ ! -x .tools/uv/bin/uv ] && ! "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1; then
  echo "setup: installing python3-venv (uv is installed into a virtualenv of its own)"
  apt_install "Python's venv module" python3-venv
fi

if [ ! -x .tools/uv/bin/uv ] || ! .tools/uv/bin/uv --version | grep -q "$UV_VERSION"; then
  echo "setup: installing uv $UV_VERSION into .tools/uv"
  "$PYTHON" -m venv .tools/uv
  .tools/uv/bin/pip install --quiet "uv==$UV_VERSION"
fi

echo "setup: syncing .venv from uv.lock"
# Bytecode is compiled at install: every Dagster run, Spark Connect client and Spark Python worker is a new
# process, and where PYTHONDONTWRITEBYTECODE is set (as in many CI and container images) each one would
# otherwise compile dagster, pandas and pyspark from source again (about 3 s per process on two cores).
.tools/uv/bin/uv sync --frozen --quiet --compile-bytecode --python "$PYTHON"
"$PWD/.venv/bin/python" -m compileall -q -j 0 dagster_streamgroup jobs sensors definitions.py >/dev/null

if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java 17 (Spark needs it)"
  apt_install java openjdk-17-jre-headless || true
fi

# Jars from Maven Central: resolved by Maven from a pom (nothing is built), kept in .tools/, checked against their
# pinned checksums each run; fetched again only when one is missing or differs.
jars_ok() {  # FOLDER SUMS
  [ -d "$1" ] && (cd "$1" && sha256sum --quiet --strict -c "$OLDPWD/$2" >/dev/null 2>&1) \
    && [ "$(find "$1" -name '*.jar' | wc -l)" = "$(wc -l < "$2")" ]
}
fetch_jars() {  # POM SUMS FOLDER WHAT
  if jars_ok "$3" "$2"; then return 0; fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "setup: installing Maven (it fetches $4)"
    apt_install mvn maven
  fi
  echo "setup: fetching $4 from Maven Central into $3"
  rm -rf "$3.partial"
  mvn -q -B -f "$1" -Dmaven.repo.local="$PWD/.tools/m2" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$PWD/$3.partial"
  rm -rf "$3" && mv "$3.partial" "$3"
  if ! jars_ok "$3" "$2"; then
    echo "setup: the jars of $4 in $3 do not match $2" >&2
    exit 1
  fi
}
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' kafka/pom.xml)
fetch_jars kafka/pom.xml kafka/jars.sha256 ".tools/kafka-$KAFKA_VERSION/libs" "Apache Kafka $KAFKA_VERSION (broker and tools)"
SPARK_VERSION=$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' spark_kafka/pom.xml)
fetch_jars spark_kafka/pom.xml spark_kafka/jars.sha256 ".tools/spark-kafka-$SPARK_VERSION/jars" \
  "Spark $SPARK_VERSION's Kafka source (spark-sql-kafka-0-10)"

fetch_jars spark_formats/pom.xml spark_formats/jars.sha256 ".tools/spark-formats-$SPARK_VERSION/jars" \
  "Spark $SPARK_VERSION's Avro functions (spark-avro)"

# The local Schema Registry: one archive from Maven Central (copied by Maven, checked against registry/archive.sha256),
# unpacked into .tools/ and every file checked against registry/files.sha256; fetched again only when a file is
# missing or differs.
REGISTRY_VERSION=$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' registry/pom.xml)
REGISTRY_DIR=".tools/apicurio-registry-$REGISTRY_VERSION"
registry_ok() {
  [ -d "$REGISTRY_DIR" ] && (cd "$REGISTRY_DIR" && sha256sum --quiet --strict -c "$OLDPWD/registry/files.sha256" >/dev/null 2>&1) \
    && [ "$(find "$REGISTRY_DIR" -type f | wc -l)" = "$(wc -l < registry/files.sha256)" ]
}
if ! registry_ok; then
  if ! command -v mvn >/dev/null 2>&1; then
    echo "setup: installing Maven (it fetches the Schema Registry)"
    apt_install mvn maven
  fi
  echo "setup: fetching Apicurio Registry $REGISTRY_VERSION (the local Schema Registry) from Maven Central into $REGISTRY_DIR"
  rm -rf "$REGISTRY_DIR.download" "$REGISTRY_DIR.partial"
  mvn -q -B -f registry/pom.xml -Dmaven.repo.local="$PWD/.tools/m2" dependency:copy-dependencies \
    -DincludeScope=runtime -DexcludeTransitive=true -DoutputDirectory="$PWD/$REGISTRY_DIR.download"
  if ! (cd "$REGISTRY_DIR.download" && sha256sum --quiet --strict -c "$OLDPWD/registry/archive.sha256"); then
    echo "setup: the Schema Registry archive in $REGISTRY_DIR.download does not match registry/archive.sha256" >&2
    exit 1
  fi
  mkdir -p "$REGISTRY_DIR.partial"
  tar -xzf "$REGISTRY_DIR.download/$(cut -d' ' -f3 registry/archive.sha256)" -C "$REGISTRY_DIR.partial"
  rm -rf "$REGISTRY_DIR.download" "$REGISTRY_DIR" && mv "$REGISTRY_DIR.partial" "$REGISTRY_DIR"
  if ! registry_ok; then
    echo "setup: the files of the Schema Registry in $REGISTRY_DIR do not match registry/files.sha256" >&2
    exit 1
  fi
fi
# It runs on Java 21 or newer (Debian 12 packages only 17): found where the registry's own lookup finds it.
if ! registry_java=$("$PWD/.venv/bin/python" -c 'from dagster_streamgroup.local.schema_registry import registry_java; print(registry_java())' 2>/dev/null); then
  echo "setup: no Java 21+ for the local Schema Registry (JAVA_HOME, the PATH and /usr/lib/jvm looked at); install one or set STREAMGROUP_REGISTRY_JAVA" >&2
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "setup: installing PostgreSQL server binaries"
  apt_install postgresql postgresql || echo "setup: PostgreSQL could not be installed; scripts/test.sh will fail without it" >&2
fi
