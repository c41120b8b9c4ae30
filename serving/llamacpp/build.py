"""Build llama.cpp's `llama-server` once, from a pinned source, into a cache keyed by flags.

    python -m serving.llamacpp.build          # make setup runs this; prints the binary's path
    python -m serving.llamacpp.build --cpu portable

The source is the `llama-cpp-python` sdist from PyPI (its `vendor/llama.cpp` is the whole
llama.cpp tree, the server and the conversion scripts included); PyPI is the one place this
machine may fetch from, and nothing prebuilt is ever downloaded. The build lands in
`~/.cache/tracetrain/llama.cpp/<version>-<flags hash>/` (or `$TRACETRAIN_CACHE`), so a second
`make setup`, a clean clone on the same machine, and every worktree reuse it.

CPU flags: `GGML_NATIVE=ON` crashed with "Illegal instruction" on a VM whose CPU lists AMX the
hypervisor refuses. So the build names its instruction sets explicitly: `auto` takes those the
kernel reports in /proc/cpuinfo (the kernel hides AVX-512 the OS does not enable) and never AMX;
`portable` takes none (plain x86-64, runs anywhere, slower). The source is patched first
(serving/llamacpp/patches.py: what the pipeline needs that upstream lacks). After building, the server is run
on the default model for two tokens; a binary that dies there is rebuilt `portable`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from serving.llamacpp import patches
from tracetrain.errors import TracetrainError

# The pinned source: llama-cpp-python's sdist carries llama.cpp at this commit.
LLAMA_CPP_PYTHON = "0.3.36"
TARGETS = ("llama-server", "llama-batched-bench")
# cpuinfo flag -> GGML option, in the order GGML documents them.
_X86_LEVELS = {
    "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2", "avx512f": "GGML_AVX512", "avx512_vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}


class BuildError(TracetrainError):
    """llama.cpp could not be fetched, built or run here."""


def cache_root() -> Path:
    base = os.environ.get("TRACETRAIN_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracetrain"
    return Path(base)


def cpu_flags(cpu: str) -> dict[str, str]:
    """The GGML CMake options for `cpu` ('auto' or 'portable')."""
    if cpu not in ("auto", "portable"):
        raise BuildError(f"cpu={cpu!r}; expected 'auto' or 'portable'")
    flags = {"GGML_NATIVE": "OFF", "GGML_AMX_TILE": "OFF", "GGML_AMX_INT8": "OFF",
             "GGML_AMX_BF16": "OFF"}
    have: set[str] = set()
    if cpu == "auto" and platform.machine() in ("x86_64", "AMD64"):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                break
    for flag, option in _X86_LEVELS.items():
        flags[option] = "ON" if flag in have else "OFF"
    return flags


def build_key(flags: dict[str, str]) -> str:
    digest = hashlib.sha1((repr(sorted(flags.items())) + patches.digest()).encode()).hexdigest()[:10]
    return f"{LLAMA_CPP_PYTHON}-{digest}"


def source_dir() -> Path:
    """The llama.cpp tree (fetched from PyPI once): conversion scripts and the server's code."""
    root = cache_root() / "llama.cpp"
    tree = root / f"src-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    download = root / "download"
    print(f"fetching llama-cpp-python=={LLAMA_CPP_PYTHON} (source) from PyPI ...", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(download)], check=False)
    archives = sorted(download.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if done.returncode or not archives:
        raise BuildError(f"pip could not download llama-cpp-python=={LLAMA_CPP_PYTHON}'s sdist "
                         "(needs PyPI)")
    staging = root / f"src-{LLAMA_CPP_PYTHON}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    with tarfile.open(archives[0]) as archive:
        archive.extractall(staging, filter="data")
    (staging / f"llama_cpp_python-{LLAMA_CPP_PYTHON}").rename(root / f"src-{LLAMA_CPP_PYTHON}")
    staging.rmdir()
    shutil.rmtree(download, ignore_errors=True)
    return tree


def binary_path(cpu: str = "auto") -> Path:
    return cache_root() / "llama.cpp" / build_key(cpu_flags(cpu)) / "bin" / "llama-server"


def find_server() -> Path:
    """The built llama-server (whichever CPU variant was built and checked), or a clear error."""
    for cpu in ("auto", "portable"):
        path = binary_path(cpu)
        if path.is_file() and (path.parent / ".checked").is_file():
            return path
    raise BuildError("llama-server is not built; run `make setup` (or "
                     "`python -m serving.llamacpp.build`) first")


def build(cpu: str = "auto", jobs: int | None = None) -> Path:
    """Build (or reuse) llama-server for `cpu`; returns its path."""
    flags = cpu_flags(cpu)
    out = cache_root() / "llama.cpp" / build_key(flags)
    server = out / "bin" / "llama-server"
    if server.is_file():
        return server
    tree = source_dir()
    patches.apply(tree)
    work = out.with_name(out.name + ".build")
    options = {"CMAKE_BUILD_TYPE": "Release", "LLAMA_CURL": "OFF", "LLAMA_OPENSSL": "OFF",
               "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF",
               "BUILD_SHARED_LIBS": "OFF", **flags}
    print(f"building llama-server ({cpu}: {' '.join(k for k, v in flags.items() if v == 'ON')})"
          f" into {out}; this takes minutes", flush=True)
    configure = ["cmake", "-S", str(tree), "-B", str(work),
                 *(f"-D{key}={value}" for key, value in options.items())]
    compile_ = ["cmake", "--build", str(work), "-j", str(jobs or os.cpu_count() or 2),
                "--target", *TARGETS]
    for step in (configure, compile_):
        if shutil.which(step[0]) is None:
            raise BuildError("cmake is needed to build llama.cpp (apt-get install cmake g++)")
        if subprocess.run(step, check=False).returncode:
            raise BuildError(f"llama.cpp build step failed: {' '.join(step)}")
    (out / "bin").mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        shutil.copy2(work / "bin" / target, out / "bin" / target)
    shutil.rmtree(work, ignore_errors=True)
    return server


def check(server: Path) -> bool:
    """Run the server on the default model for two tokens; False if it dies (e.g. SIGILL)."""
    from serving.llamacpp.server import LlamaServer
    from tracetrain.base_model import shipped_gguf

    try:
        with LlamaServer(server, shipped_gguf(), slots=1, context=256, threads=1) as running:
            running.complete({"prompt": [1, 2], "n_predict": 2})
    except TracetrainError as exc:
        print(f"{server} does not run here: {exc}", file=sys.stderr)
        return False
    (server.parent / ".checked").touch()
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", choices=("auto", "portable"), default="auto",
                        help="instruction sets: those this CPU reports (never AMX), or none")
    args = parser.parse_args(argv)
    try:
        server = build(args.cpu)
        if not (server.parent / ".checked").is_file() and not check(server):
            if args.cpu == "portable":
                raise BuildError(f"{server} does not run even built portable")
            server = build("portable")
            if not check(server):
                raise BuildError(f"{server} does not run even built portable")
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
