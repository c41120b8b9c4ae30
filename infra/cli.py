"""`tracetrain kafka|topics|up|down|status`: the local stack on loopback."""

from __future__ import annotations

import signal
import time

import typer
from rich.console import Console
from rich.table import Table

from infra import mlflow_server, processes, profiles, stack, topics
from infra.kafka import broker
from tracetrain.errors import InfraError
from tracetrain.settings import get_settings

console = Console()
kafka_app = typer.Typer(help="The local Kafka broker(s), KRaft mode, from Maven Central jars.",
                        no_args_is_help=True)
topics_app = typer.Typer(help="The pipeline's topics: create them, list them.", no_args_is_help=True)


@kafka_app.command("start")
def kafka_start(
    brokers: int = typer.Option(None, help="1 or 3 brokers (default: TRACETRAIN_KAFKA__BROKERS)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once the broker answers."),
) -> None:
    """Format storage (first time) and start KRaft broker(s) on loopback."""
    settings = get_settings()
    started = broker.start(settings.home_dir, settings.kafka, brokers)
    for record in started:
        console.print(f"[green]started[/] {record.name} pid {record.pid} at {record.address} "
                      f"(log {record.log})")
    if detach:
        return
    console.print("Kafka runs in the foreground; Ctrl-C stops it.")
    try:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while all(processes.pid_alive(r.pid) for r in started):
            time.sleep(1)
        console.print("[red]a broker exited[/]; see its log")
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop(settings.home_dir)


@kafka_app.command("stop")
def kafka_stop() -> None:
    """Stop the brokers this state folder started (and nothing else)."""
    stopped = broker.stop(get_settings().home_dir)
    console.print(f"stopped {', '.join(stopped)}" if stopped else "no broker of ours was running")


@topics_app.command("create")
def topics_create() -> None:
    """Create the design's topics from settings; a no-op for those that exist."""
    settings = get_settings()
    created = topics.create_topics(settings.kafka.bootstrap_servers, settings.topics)
    console.print(f"created {', '.join(created)}" if created else "all topics already exist")


@topics_app.command("list")
def topics_list() -> None:
    """Show the pipeline's topics with partitions, replication and end offsets."""
    settings = get_settings()
    table = Table("topic", "partitions", "replication", "messages", "end offsets")
    for info in topics.describe_topics(settings.kafka.bootstrap_servers, settings.topics):
        table.add_row(info.name, str(info.partitions), str(info.replication),
                      str(info.messages), " ".join(map(str, info.end_offsets)))
    console.print(table)


def up(
    profile: str = typer.Option(
        "dev", help=f"What runs. {profiles.help_text()}. Run again, production starts only "
        "what is not running (a broker or service that died)."),
    brokers: int = typer.Option(None, help="dev: 1 or 3 Kafka brokers."),
    services: str = typer.Option(
        None, help="dev: comma-separated, started in this order after Kafka and MLflow: "
        f"{', '.join(stack.PLATFORM + tuple(stack.SERVICES))} (default kafka,mlflow)."
    ),
) -> None:
    """Start the local stack detached, each process waited for until healthy: Kafka, topics,
    MLflow (and the named services), or a whole profile (`--profile production`: the
    production topology without Docker); `tracetrain status` shows them, `tracetrain down`
    stops them."""
    settings = get_settings()
    chosen = profiles.get(profile)
    if chosen is profiles.DEV:
        names = [s.strip() for s in (services or "kafka,mlflow").split(",") if s.strip()]
        started = stack.up(settings, names, brokers=brokers)
    elif services is not None or brokers is not None:
        raise InfraError(f"--profile {profile} runs a fixed topology ({chosen.summary}); "
                         "--services and --brokers are for --profile dev")
    else:
        started = stack.up_profile(settings, chosen)
    for record in started:
        console.print(f"[green]up[/] {record.name} pid {record.pid} at {record.address}")
    status()


def down(wipe: bool = typer.Option(False, help="Also delete Kafka and MLflow data.")) -> None:
    """Stop everything `up` started (only processes with our pid files)."""
    stopped = stack.down(get_settings(), wipe=wipe)
    console.print(f"stopped {', '.join(stopped)}" if stopped else "nothing of ours was running")


def status() -> None:
    """Each process of the stack: pid, address, health."""
    settings = get_settings()
    table = Table("process", "pid", "address", "health", "log")
    records = processes.records(settings.home_dir)
    for record in records:
        ok = processes.healthy(record)
        table.add_row(record.name, str(record.pid), record.address,
                      "[green]healthy[/]" if ok else "[red]down[/]", record.log)
    if not records:
        console.print(f"nothing is running from {settings.home_dir}")
        return
    console.print(table)
    # Only an MLflow that runs: `up --services kafka,engine` starts none.
    if settings.mlflow.tracking_uri or any(r.name == mlflow_server.NAME for r in records):
        console.print(f"MLflow UI: {settings.mlflow.uri}")


def smoke(spans: int = typer.Option(5, help="Spans to publish and read back.")) -> None:
    """Check the local stack: bring it up, publish and read back a few spans, stop it."""
    from infra import smoke

    found = smoke.run(get_settings(), spans, console, status)
    if found != spans:
        raise typer.Exit(1)
