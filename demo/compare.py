"""`tracetrain demo --compare rl,sft`: learner modes side by side on one picture.

    tracetrain demo --compare rl,sft --minutes 12

Runs a whole `tracetrain demo` per mode, one after another, with the same options; only the
mode differs. The problem seeds are fixed (training rounds from `TRAIN_SEED`, the held-out set
from `HELD_OUT_SEED`), so every mode trains on the same problem stream and is checked on the
same held-out problems. Each run keeps its own folder `home/demo/<run>/`. Then writes
`home/demo/compare-<time>/compare.png` (held-out accuracy against minutes of training, one line
per mode) and `compare.json`, copies the picture to `home/demo/compare.png`, and returns the
JSON line the CLI prints: each mode's base and final accuracy, n, minutes and versions.

    python -m demo.compare DIR/summary.json OTHER/summary.json [--out FOLDER]

draws the same picture from runs made one at a time (`tracetrain demo --mode ...` with the same
other options: the problems come from the same fixed seeds), when a machine cannot give the
modes one long sitting.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from demo.report import save_figure
from demo.run import DemoOptions, DemoRun
from tracetrain.modes import LEARNER_MODES, one_of
from tracetrain.settings import Settings

# what the JSON line gives of each mode's summary
LINE_KEYS = ("final_accuracy", "base_accuracy", "n", "minutes", "training_minutes", "versions")


def parse_modes(text: str) -> tuple[str, ...]:
    """'rl,sft' -> ('rl', 'sft'); a ValueError naming the first value that is not a mode."""
    modes = tuple(part.strip() for part in text.split(","))
    for mode in modes:
        if mode not in LEARNER_MODES:
            raise ValueError(f"{mode!r}: expected learner modes from {one_of(LEARNER_MODES)}")
        if modes.count(mode) > 1:
            # the comparison is keyed by mode: a second run of one would hide the first
            raise ValueError(f"{mode!r} is named twice in {text!r}")
    if len(modes) < 2:
        raise ValueError(f"{text!r}: name at least two modes to compare, e.g. rl,sft")
    return modes


def same_warm_start(opts: DemoOptions, modes: tuple[str, ...]) -> DemoOptions:
    """`opts` with one warm start for every mode: where none is given, the smallest of the
    modes' defaults (sft's is longer: demo/run.py), so each mode starts from the same worked
    problems."""
    if opts.warm_start is not None:
        return opts
    return replace(opts, warm_start=min(replace(opts, mode=m).warm_start_problems for m in modes))


def run_modes(settings: Settings, opts: DemoOptions, modes: tuple[str, ...],
              console: Console) -> list[dict]:
    """One demo run per mode, in order; the summaries of those that ran."""
    summaries = []
    opts = same_warm_start(opts, modes)
    for mode in modes:
        console.print(f"[bold cyan]demo[/] comparing {', '.join(modes)}: mode {mode}")
        summaries.append(DemoRun(settings, replace(opts, mode=mode), console).run())
        if summaries[-1].get("stopped_early"):
            # Ctrl-C means stop, not skip to the next mode; what ran is still compared
            console.print("[bold cyan]demo[/] stopped early: the modes after it are not run")
            break
    return summaries


def curve(summary: dict) -> tuple[list[float], list[float]]:
    """Minutes and held-out accuracy: the base model at 0, each version's check when it
    finished, the final version when its evaluation finished."""
    checks = summary.get("heldout_per_version", [])
    minutes = [0.0, *(c["minutes"] for c in checks), summary["training_minutes"]]
    accuracy = [summary["base_accuracy"], *(c["accuracy"] for c in checks),
                summary["final_accuracy"]]
    return minutes, accuracy


def line(summaries: list[dict], png: Path) -> dict:
    return {"compare": {s["mode"]: {key: s[key] for key in LINE_KEYS} for s in summaries},
            "png": str(png)}


def plot(summaries: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for index, summary in enumerate(summaries):
        minutes, accuracy = curve(summary)
        color = f"C{index}"
        ax.plot(minutes, accuracy, "-", color=color, alpha=0.7,
                label=f"{summary['mode']}: {summary['base_accuracy']:.3f} -> "
                      f"{summary['final_accuracy']:.3f} (n={summary['n']}), "
                      f"{summary['versions']} versions"
                      # minute 0 comes after it: the warm start is served before any traffic
                      + (f", after a {summary['warm_start_minutes']:.1f}-minute warm start"
                         if summary.get("warm_start_minutes") else ""))
        ax.plot(minutes[1:-1], accuracy[1:-1], "o", color=color, markersize=4)
        ax.plot([minutes[0], minutes[-1]], [accuracy[0], accuracy[-1]], "s", color=color,
                markersize=7)
    # Marker shapes say which figures rest on the full held-out set and which on a few problems
    full = sorted({s["n"] for s in summaries})
    few = sorted({c["n"] for s in summaries for c in s.get("heldout_per_version", [])})
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color="gray", marker="s", linestyle="none",
                          label=f"base and final (n={'/'.join(map(str, full))})"))
    if few:
        handles.append(Line2D([], [], color="gray", marker="o", markersize=4, linestyle="none",
                              label=f"check of each new version (n={'/'.join(map(str, few))}, "
                                    "fewer problems: noisier)"))
    task = "/".join(sorted({s["task"] for s in summaries}))
    ax.set_title(f"held-out accuracy, task {task}: same problems, options and minutes per mode",
                 fontsize=10)
    ax.set_xlabel("minutes since training traffic started (each point when its evaluation ended)")
    ax.set_ylabel("held-out accuracy")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    return save_figure(fig, ax, path)


def save(summaries: list[dict], demo_dir: Path, stamp: str | None = None) -> dict:
    """`compare-<stamp>/compare.png` and `compare.json` under `demo_dir`, the picture also as
    `demo_dir/compare.png` (the newest); the JSON line."""
    folder = demo_dir / f"compare-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    png = plot(summaries, folder / "compare.png")
    result = line(summaries, png)
    (folder / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (demo_dir / "compare.png").write_bytes(png.read_bytes())
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m demo.compare", description="The "
                                     "comparison picture and JSON line from demo runs' "
                                     "summary.json files (one per mode, same options).")
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(".tracetrain/demo"),
                        help="where compare-<time>/ and compare.png go (default: %(default)s)")
    args = parser.parse_args(argv)
    runs = []
    for path in args.summaries:
        if not path.is_file():
            parser.error(f"{path}: no such summary (expected a demo run's summary.json)")
        runs.append(json.loads(path.read_text()))
    if len({run["mode"] for run in runs}) != len(runs):
        parser.error(f"modes {[run['mode'] for run in runs]}: expected one run per mode")
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(save(runs, args.out)))


if __name__ == "__main__":
    main()
