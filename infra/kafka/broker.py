"""Local Apache Kafka 4.x in KRaft mode, from the jars `infra/kafka/pom.xml` resolves.

    tracetrain kafka start [--brokers 1|3] [--detach]
    tracetrain kafka stop

Each broker runs as broker+controller (combined mode) on loopback; storage, config, logs and
pid files live under the state folder (`$TRACETRAIN_HOME/kafka/`). A single broker gets
replication factor 1 for offsets and transaction state (min ISR 1) — without that, consumer
groups and transactions hang; three brokers get replication 3 and min ISR 2.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from infra import processes
from tracetrain.errors import InfraError
from tracetrain.settings.infra import KafkaSettings

LIB_DIR = Path(__file__).parent / "lib"
POM = Path(__file__).parent / "pom.xml"


def classpath() -> str:
    """The broker classpath, resolving the jars from Maven Central on first use."""
    if not any(LIB_DIR.glob("kafka_2.13-*.jar")):
        mvn = shutil.which("mvn")
        if mvn is None:
            raise InfraError(f"Kafka jars missing in {LIB_DIR} and Maven is not installed "
                             "(apt-get install maven, then `make kafka-jars`)")
        subprocess.run([mvn, "-q", "-B", "-f", str(POM), "package"], check=True)
    return f"{LIB_DIR}/*"


def java() -> str:
    path = shutil.which("java")
    if path is None:
        raise InfraError("Java 17+ is needed to run Kafka and was not found on PATH "
                         "(apt-get install openjdk-17-jre-headless)")
    return path


def broker_name(index: int) -> str:
    return f"kafka-{index + 1}"


def bootstrap(kafka: KafkaSettings, brokers: int) -> str:
    return ",".join(f"127.0.0.1:{kafka.port + i}" for i in range(brokers))


def _properties(kafka: KafkaSettings, index: int, brokers: int, data: Path) -> str:
    voters = ",".join(f"{i + 1}@127.0.0.1:{kafka.controller_port + i}" for i in range(brokers))
    replication = 1 if brokers == 1 else 3
    min_isr = 1 if brokers == 1 else 2
    port, cport = kafka.port + index, kafka.controller_port + index
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={index + 1}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data}",
        f"offsets.topic.replication.factor={replication}",
        f"transaction.state.log.replication.factor={replication}",
        f"transaction.state.log.min.isr={min_isr}",
        f"default.replication.factor={replication}",
        f"min.insync.replicas={min_isr}",
        "auto.create.topics.enable=false",
        # Consumer groups form at once instead of waiting 3 s for more members.
        "group.initial.rebalance.delay.ms=0",
        "num.partitions=1",
        # The log cleaner allocates this buffer in one piece when the broker starts (Kafka's
        # default 128 MiB): on a 256 MB heap that allocation failed now and then with
        # OutOfMemoryError and the broker died at start-up (the production rehearsal,
        # 2026-12-07). An eighth of the heap still holds over a million keys a cleaning pass.
        f"log.cleaner.dedupe.buffer.size={cleaner_buffer_bytes(kafka.heap_mb)}",
        "",
    ])


def cleaner_buffer_bytes(heap_mb: int) -> int:
    """The log cleaner's dedupe buffer for a broker of `heap_mb` MB of heap: an eighth of it."""
    return heap_mb * 1024 * 1024 // 8


def start(home: Path, kafka: KafkaSettings, brokers: int | None = None,
          only: list[int] | None = None) -> list[processes.ProcessRecord]:
    """Format storage (first time) and start the broker(s) detached; wait until all of the
    cluster's answer. `only` (indices) starts those alone, the others running: a broker that
    died, started again (`missing` says which)."""
    brokers = brokers or kafka.brokers
    indices = list(range(brokers)) if only is None else only
    if brokers not in (1, 3):
        raise InfraError(f"--brokers {brokers}: expected 1 or 3")
    java_bin, cp = java(), classpath()
    root = Path(home) / "kafka"
    root.mkdir(parents=True, exist_ok=True)
    layout = root / "layout"
    if layout.is_file() and layout.read_text().strip() != str(brokers):
        raise InfraError(f"{root} was formatted for {layout.read_text().strip()} broker(s); "
                         f"remove it (`tracetrain down --wipe`) to start {brokers}")
    for i in indices:  # broker i listens on port + i, its controller on controller_port + i
        processes.require_free("127.0.0.1", kafka.port + i, f"Kafka broker {i + 1}", "kafka.port")
        processes.require_free("127.0.0.1", kafka.controller_port + i, f"Kafka controller {i + 1}",
                               "kafka.controller_port")
    cluster_file = root / "cluster-id"
    if not cluster_file.is_file():
        cluster_file.write_text(_random_cluster_id(java_bin, cp))
    cluster_id = cluster_file.read_text().strip()
    started = []
    for i in indices:
        data = root / f"broker-{i + 1}"
        config = root / f"broker-{i + 1}.properties"
        config.write_text(_properties(kafka, i, brokers, data))
        if not (data / "meta.properties").is_file():
            subprocess.run(
                [java_bin, "-cp", cp, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                 "-c", str(config)],
                check=True, capture_output=True,
            )
        argv = [java_bin, f"-Xmx{kafka.heap_mb}m", f"-Xms{min(kafka.heap_mb, 256)}m",
                "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={_log4j_config(root)}",
                "-cp", cp, "kafka.Kafka", str(config)]
        started.append(processes.spawn(home, broker_name(i), argv,
                                       address=f"127.0.0.1:{kafka.port + i}"))
    layout.write_text(str(brokers))
    servers = bootstrap(kafka, brokers)
    try:
        # Every broker's death is watched, not only one's: a broker that could not bind its
        # port leaves its peers waiting for a quorum that never comes, and only its own log
        # says why.
        def dead() -> processes.ProcessRecord | None:
            return next((r for r in started if not processes.pid_alive(r.pid)), None)

        processes.wait_until(
            lambda: _brokers_seen(servers) >= brokers or dead() is not None,
            kafka.start_timeout_s, f"Kafka ({', '.join(r.name for r in started)})",
            log=started[0].log if started else None,
        )
        if (gone := dead()) is not None:
            raise InfraError(f"Kafka ({gone.name}) exited during start-up"
                             f"{processes.log_tail(gone.log)}")
    except BaseException:
        # Brokers that missed their start-up bound, or whose caller was stopped meanwhile
        # (Ctrl-C, SIGTERM), must not linger: the caller never learns of them, so nothing
        # else would stop them.
        for record in reversed(started):
            processes.stop(home, record.name, timeout_s=30)
        raise
    return started


def _random_cluster_id(java_bin: str, cp: str) -> str:
    out = subprocess.run([java_bin, "-cp", cp, "kafka.tools.StorageTool", "random-uuid"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def _log4j_config(root: Path) -> Path:
    path = root / "log4j2.properties"
    path.write_text("\n".join([
        "rootLogger.level=INFO",
        "rootLogger.appenderRef.stdout.ref=STDOUT",
        "appender.stdout.type=Console",
        "appender.stdout.name=STDOUT",
        "appender.stdout.layout.type=PatternLayout",
        "appender.stdout.layout.pattern=[%d] %p %m (%c)%n",
        # The per-request state-change chatter would drown everything else.
        "logger.statechange.name=state.change.logger",
        "logger.statechange.level=WARN",
        "",
    ]))
    return path


def _brokers_seen(servers: str) -> int:
    from confluent_kafka.admin import AdminClient

    # librdkafka logs every refused connection; probe the sockets before asking for metadata.
    # Every broker must listen, not only the first: a client bootstrapped with the list may
    # pick any of them.
    for server in servers.split(","):
        if not processes.port_in_use(server.rsplit(":", 1)[0], int(server.rsplit(":", 1)[1])):
            return 0
    try:
        admin = AdminClient({"bootstrap.servers": servers, "socket.timeout.ms": 2000})
        return len(admin.list_topics(timeout=2).brokers)
    except Exception:  # KafkaException while the broker is still starting
        return 0


def missing(home: Path, brokers: int) -> list[int]:
    """Indices of the cluster's brokers that are not running (no pid file of a live one)."""
    return [i for i in range(brokers)
            if not ((r := processes.read_record(home, broker_name(i))) and processes.is_ours(r))]


def stop(home: Path) -> list[str]:
    """Stop every broker we started (highest first, so controllers keep quorum longest)."""
    stopped = []
    for record in reversed(processes.records(home)):
        if record.name.startswith("kafka-") and processes.stop(home, record.name, timeout_s=30):
            stopped.append(record.name)
    return stopped
