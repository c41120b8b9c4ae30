"""What the demo leaves behind under `home/demo/`: `summary.json` and the reward curve."""

from __future__ import annotations

import json
from pathlib import Path

from demo.monitor import HeldOut
from demo.traffic import Episode


def write_summary(folder: Path, summary: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "summary.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path


def heldout_point(check: HeldOut, started: float) -> dict:
    """A held-out check as the summary keeps it: with its minutes since training started,
    which a comparison of runs plots against (their absolute times differ)."""
    return {**check.__dict__, "minutes": round((check.at - started) / 60, 2)}


def plot_curve(path: Path, episodes: list[Episode], heldout: list[HeldOut], started: float,
               base: tuple[float, int] | None, final: tuple[float, int] | None,
               window: int = 64) -> Path:
    """Moving-average training reward over time, held-out accuracy per version, base and
    final accuracy (with their n) as reference lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if episodes:
        xs = [(e.at - started) / 60 for e in episodes]
        rewards = [e.reward for e in episodes]
        moving = [sum(rewards[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1))
                  for i in range(len(rewards))]
        ax.plot(xs, moving, label=f"training reward (moving mean of {window} rollouts)")
    if heldout:
        ax.plot([(h.at - started) / 60 for h in heldout], [h.accuracy for h in heldout], "o--",
                label=f"held-out accuracy per version (n={heldout[0].n})")
    for value, label, style in ((base, "base", ":"), (final, "final", "-.")):
        if value is not None:
            ax.axhline(value[0], linestyle=style, color="gray")
            ax.annotate(f"{label} {value[0]:.2f} (n={value[1]})", (0, value[0]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("minutes of training")
    ax.set_ylabel("reward / accuracy")
    ax.legend(loc="upper left", fontsize=8)
    return save_figure(fig, ax, path)


def save_figure(fig, ax, path: Path) -> Path:
    """The demo's pictures alike: accuracy's full range, a light grid, written to `path`."""
    import matplotlib.pyplot as plt

    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
