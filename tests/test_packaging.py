"""The wheel holds the product only: no test double, workload generator, fixture, test or
benchmark is installed by `pip install .` (they live in testkit/, tests/ and bench/, which run
from the repository root)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# State and build output a checkout may hold; none of it is source the wheel is built from.
NOT_SOURCE = {".git", ".venv", ".tracetrain", "build", "dist", "mlruns", "infra/kafka/lib",
              "infra/kafka/target"}
NOT_SOURCE_NAMES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis"}
NEVER_INSTALLED = {"testkit", "tests", "bench"}


def _copy_source(dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(REPO)
        return {n for n in names if n in NOT_SOURCE_NAMES or n.endswith(".egg-info")
                or (rel / n).as_posix() in NOT_SOURCE}

    shutil.copytree(REPO, dest, ignore=ignore)


def test_the_wheel_installs_no_test_double_workload_or_benchmark(tmp_path):
    # Built from a copy: building in place would write build/ and *.egg-info into the checkout.
    source = tmp_path / "source"
    _copy_source(source)
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", str(source), "-w", str(out)], check=True, capture_output=True, text=True)
    [wheel] = out.glob("*.whl")
    files = [name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name]
    top = {name.split("/")[0] for name in files}
    assert {"tracetrain", "schemas", "producers", "streams", "learner", "serving", "infra",
            "examples", "demo", "optimizer"} <= top, sorted(top)
    assert not top & NEVER_INSTALLED, sorted(top & NEVER_INSTALLED)
    doubles = [name for name in files
               if Path(name).name in {"fixed_upstream.py", "workload.py", "conftest.py"}
               or Path(name).name.startswith("test_")]
    assert doubles == [], doubles
