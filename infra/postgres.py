"""The local PostgreSQL server that MLflow's production backend store runs on.

    tracetrain up --profile production      # starts it before MLflow

Debian's `postgresql` package (`.ci/run` installs it as it installs Java): the binaries are
found under /usr/lib/postgresql/<version>/bin (the newest), not on PATH. The cluster lives
under the state folder (`$TRACETRAIN_HOME/postgres/data`), is created on first start by
`initdb` with one superuser (`postgres.user`, trusted on loopback only: it listens on
127.0.0.1 and a socket in the data folder) and holds the database `postgres.database`.

PostgreSQL refuses to run as root: as root, initdb and the server run as the `postgres` user
the package creates (`setpriv`, which execs, so the pid file names the server itself), and
the folders above the data folder get search permission (o+x, not listing) so that user can
reach it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from infra import processes
from tracetrain.errors import InfraError
from tracetrain.settings.infra import PostgresSettings

NAME = "postgres"
PACKAGE_BINS = Path("/usr/lib/postgresql")
RUN_AS = "postgres"


def bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding `postgres` and `initdb`."""
    found = [d / "bin" for d in PACKAGE_BINS.glob("*")
             if (d / "bin" / "postgres").is_file() and (d / "bin" / "initdb").is_file()]
    if not found:
        raise InfraError(f"no PostgreSQL server under {PACKAGE_BINS}/<version>/bin; install "
                         "Debian's package: apt-get install postgresql")
    return max(found, key=lambda p: _version_key(p.parent.name))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def data_dir(home: Path) -> Path:
    return (Path(home) / "postgres" / "data").resolve()


def _as_server_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """The argv prefix that drops root for the server's user, and that user (None: not root)."""
    if os.geteuid() != 0:
        return [], None
    try:
        user = pwd.getpwnam(RUN_AS)
    except KeyError as exc:
        raise InfraError(f"running as root, PostgreSQL must run as the {RUN_AS!r} user, which "
                         "does not exist (apt-get install postgresql creates it)") from exc
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
            "--"], user


def _reachable_by(path: Path, user: pwd.struct_passwd) -> None:
    """Give `user` search permission (o+x) on each folder above `path` that lacks it."""
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)
    os.chown(path, user.pw_uid, user.pw_gid)


def _initdb(bins: Path, data: Path, pg: PostgresSettings) -> None:
    prefix, user = _as_server_user()
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    if user is not None:
        _reachable_by(data, user)
    result = subprocess.run(
        [*prefix, str(bins / "initdb"), "-D", str(data), "-U", pg.user, "--auth=trust",
         "--encoding=UTF8", "--no-instructions"],
        capture_output=True, text=True)
    if result.returncode != 0:
        raise InfraError(f"initdb of {data} failed ({result.returncode}): "
                         f"{(result.stderr or result.stdout)[-2000:]}")


def is_ready(pg: PostgresSettings, database: str = "postgres") -> bool:
    import psycopg2

    try:
        psycopg2.connect(pg.uri(database), connect_timeout=2).close()
        return True
    except psycopg2.OperationalError:
        return False


def _create_database(pg: PostgresSettings) -> None:
    import psycopg2

    conn = psycopg2.connect(pg.uri("postgres"), connect_timeout=5)
    conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (pg.database,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{pg.database}"')
    finally:
        conn.close()


def start(home: Path, pg: PostgresSettings) -> processes.ProcessRecord:
    """Create the cluster (first time), start the server detached, create the database; return
    once it accepts connections."""
    processes.require_free(pg.host, pg.port, "PostgreSQL", "postgres.port")
    bins, data = bin_dir(), data_dir(home)
    if not (data / "PG_VERSION").is_file():
        _initdb(bins, data, pg)
    prefix, _ = _as_server_user()
    argv = [*prefix, str(bins / "postgres"), "-D", str(data), "-p", str(pg.port),
            "-h", pg.host, "-k", str(data)]
    record = processes.spawn(home, NAME, argv, address=f"{pg.host}:{pg.port}")
    try:
        processes.wait_until(lambda: is_ready(pg), pg.start_timeout_s, "PostgreSQL",
                             log=record.log, alive=lambda: processes.pid_alive(record.pid))
        _create_database(pg)
    except InfraError:
        stop(home)
        raise
    return record


def stop(home: Path) -> bool:
    """Fast shutdown (SIGINT: clients are disconnected, no waiting for them), then the pid
    file goes; False if no server of ours ran."""
    record = processes.read_record(home, NAME)
    if record is None:
        return False
    was_ours = processes.is_ours(record)
    if was_ours:
        os.kill(record.pid, 2)  # SIGINT: PostgreSQL's "fast" shutdown
        try:
            processes.wait_until(lambda: not processes.is_ours(record), 30, "PostgreSQL shutdown")
        except InfraError:
            pass  # processes.stop below ends it with SIGTERM, then SIGKILL
    processes.stop(home, NAME)
    return was_ours


def wipe(home: Path) -> None:
    shutil.rmtree(Path(home) / "postgres", ignore_errors=True)
