"""Draw the pipeline's topology into docs/topology.png (shown by README.md and docs/architecture.md).

    .venv/bin/python docs/topology.py

The upper row carries events from the agents into Kafka and through the Faust worker; the lower
row carries what the learner made back to the engine the agents call. Boxes are grouped by the
top-level folder that holds them (producers/, streams/, learner/, serving/, infra/).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).with_name("topology.png")

# One colour per top-level folder, light fills so the text stays black and legible.
COLOURS = {
    "agents": "#eeeeee",
    "producers": "#dbe9f6",
    "kafka": "#fde7c8",
    "streams": "#dcf0dc",
    "learner": "#f6dcdc",
    "mlflow": "#e8ddf3",
    "serving": "#fff6bf",
}
EDGE = "#444444"


def box(ax, x, y, w, h, title, detail="", colour="agents", title_size=13.5, detail_size=10.5):
    """A rounded box centred on (x, y); returns its (left, right, bottom, top, x, y)."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=COLOURS[colour], edgecolor=EDGE, linewidth=1.2,
                                zorder=2))
    if detail:
        ax.text(x, y + h * 0.18, title, ha="center", va="center", fontsize=title_size,
                fontweight="bold", zorder=3)
        ax.text(x, y - h * 0.2, detail, ha="center", va="center", fontsize=detail_size,
                color="#222222", zorder=3, linespacing=1.15)
    else:
        ax.text(x, y, title, ha="center", va="center", fontsize=title_size,
                fontweight="bold", zorder=3)
    return {"l": x - w / 2, "r": x + w / 2, "b": y - h / 2, "t": y + h / 2, "x": x, "y": y}


def group(ax, x0, y0, x1, y1, label, colour):
    """A dashed frame around boxes of one folder, labelled at its top left."""
    ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0,
                                boxstyle="round,pad=0.02,rounding_size=0.2",
                                facecolor=COLOURS[colour], alpha=0.35, edgecolor=EDGE,
                                linestyle=(0, (4, 3)), linewidth=1.0, zorder=1))
    ax.text(x0 + 0.12, y1 - 0.1, label, ha="left", va="top", fontsize=11.5,
            style="italic", color="#333333", zorder=3)


def arrow(ax, start, end, label="", rad=0.0, label_at=0.5, label_dx=0.0, label_dy=0.0,
          style="-|>", colour="#333333", ls="-", label_size=10.5):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14,
                                 connectionstyle=f"arc3,rad={rad}", color=colour,
                                 linewidth=1.4, linestyle=ls, shrinkA=2, shrinkB=2, zorder=4))
    if label:
        x = start[0] + (end[0] - start[0]) * label_at + label_dx
        y = start[1] + (end[1] - start[1]) * label_at + label_dy
        ax.text(x, y, label, ha="center", va="center", fontsize=label_size, color="#222222",
                zorder=5, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0,
                                "alpha": 0.9})


def draw() -> plt.Figure:
    fig, ax = plt.subplots(figsize=(11, 6.6))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 6.6)
    ax.axis("off")

    # Agents, far left.
    agents = box(ax, 0.85, 4.55, 1.45, 1.5, "agents",
                 "openai client,\nLangChain,\nAutoGen, ...", "agents")

    # producers/: three ways in, one publisher with a disk spool under them.
    group(ax, 2.0, 2.55, 4.35, 6.45, "producers/", "producers")
    ax.text(3.17, 2.78, "all three publish through one\npublisher with a disk spool",
            ha="center", va="center", fontsize=9.5, style="italic", color="#333333", zorder=3)
    otel = box(ax, 3.17, 5.55, 2.05, 0.62, "OTel exporter", "OTel SDK span processor",
               "producers")
    tracer = box(ax, 3.17, 4.75, 2.05, 0.62, "tracer", "in-process SDK", "producers")
    gateway = box(ax, 3.17, 3.68, 2.05, 1.05, "gateway",
                  "OpenAI API, /v1/rewards,\nOTLP /v1/traces", "producers")

    # Kafka topics, the middle column.
    group(ax, 5.05, 1.05, 6.75, 6.45, "Kafka topics", "kafka")
    names = ["spans", "rewards", "air", "transitions", "checkpoints", "dlq"]
    topic = {}
    for i, name in enumerate(names):
        topic[name] = box(ax, 5.9, 5.7 - i * 0.8, 1.45, 0.5, name, colour="kafka",
                          title_size=13)

    # streams/: the Faust worker, right of Kafka.
    faust = box(ax, 9.3, 4.55, 2.6, 1.75, "streams: Faust worker",
                "AIR deriver, rollout join\n(Faust table + changelog),\ncredit assignment,\n"
                "dead-letter routing", "streams", title_size=13.5, detail_size=10.5)

    # The way back: learner -> MLflow -> reloader -> engine.
    learner = box(ax, 9.3, 1.85, 2.6, 1.15, "learner (TRL)",
                  "micro-batches, LoRA step,\ncheckpoint, then commit", "learner")
    mlflow = box(ax, 6.6, 0.42, 2.0, 0.7, "MLflow registry", "versions, alias latest",
                 "mlflow", title_size=12.5, detail_size=10)
    reloader = box(ax, 4.0, 0.42, 1.75, 0.7, "reloader", "follows the alias", "serving",
                   title_size=12.5, detail_size=10)
    engine = box(ax, 1.15, 1.7, 2.0, 1.05, "engine",
                 "embedded (CPU)\nor vLLM (GPU)", "serving")

    # agents -> producers
    arrow(ax, (agents["r"], 5.0), (otel["l"], otel["y"]), rad=-0.15)
    arrow(ax, (agents["r"], 4.6), (tracer["l"], tracer["y"]))
    arrow(ax, (agents["r"], 4.1), (gateway["l"], gateway["y"] + 0.25), rad=0.15)
    ax.text(1.72, 3.7, "HTTP", ha="center", va="center", fontsize=10.5, zorder=5)

    # producers -> spans, rewards
    for src in (tracer, otel, gateway):
        arrow(ax, (src["r"], src["y"]), (topic["spans"]["l"], topic["spans"]["y"]))
    arrow(ax, (tracer["r"], tracer["y"] - 0.1), (topic["rewards"]["l"], topic["rewards"]["y"] + 0.05))
    arrow(ax, (gateway["r"], gateway["y"] - 0.15), (topic["rewards"]["l"],
                                                    topic["rewards"]["y"] - 0.1))

    # gateway <-> engine
    arrow(ax, (gateway["l"], gateway["b"] + 0.2), (engine["r"] - 0.25, engine["t"]),
          style="<|-|>")
    ax.text(0.95, 2.72, "calls forwarded;\nreplies carry token ids,\nlogprobs, policy_version",
            ha="center", va="center", fontsize=10, color="#222222", zorder=5)

    # Kafka <-> streams
    fl = faust["l"]
    arrow(ax, (topic["spans"]["r"], topic["spans"]["y"]), (fl, 5.1))
    arrow(ax, (topic["rewards"]["r"], topic["rewards"]["y"]), (fl, 4.75))
    arrow(ax, (topic["air"]["r"], topic["air"]["y"] + 0.08), (fl, 4.4))
    arrow(ax, (fl, 4.15), (topic["air"]["r"], topic["air"]["y"] - 0.12), colour="#2a7a2a")
    arrow(ax, (fl, 3.95), (topic["transitions"]["r"], topic["transitions"]["y"]),
          colour="#2a7a2a")
    arrow(ax, (fl + 0.2, faust["b"]), (topic["dlq"]["r"], topic["dlq"]["y"] + 0.08),
          "bad input", colour="#b03030", ls="--", label_at=0.35, label_dx=0.1)

    # transitions -> learner -> checkpoints, dlq, MLflow
    arrow(ax, (topic["transitions"]["r"], topic["transitions"]["y"] - 0.12),
          (learner["l"], learner["t"] - 0.15), colour="#2a7a2a")
    arrow(ax, (learner["l"], learner["y"] + 0.12), (topic["checkpoints"]["r"],
                                                    topic["checkpoints"]["y"]),
          colour="#a33")
    arrow(ax, (learner["l"], learner["b"] + 0.2), (topic["dlq"]["r"],
                                                   topic["dlq"]["y"] - 0.12),
          colour="#b03030", ls="--")
    arrow(ax, (learner["x"] - 0.5, learner["b"]), (mlflow["r"], mlflow["y"]),
          "adapter + offsets", label_at=0.45, label_dy=-0.05, colour="#a33", rad=-0.2)

    # MLflow and checkpoints -> reloader -> engine
    arrow(ax, (mlflow["l"], mlflow["y"]), (reloader["r"], reloader["y"]))
    arrow(ax, (topic["checkpoints"]["l"], topic["checkpoints"]["y"]),
          (reloader["x"] + 0.3, reloader["t"]), "wakes", rad=0.25, label_at=0.55,
          label_dx=-0.15, ls=":")
    arrow(ax, (reloader["l"], reloader["y"]), (engine["x"] + 0.3, engine["b"]),
          "loads each version", rad=-0.25, label_at=0.5, label_dx=-0.25, label_dy=-0.12)

    fig.subplots_adjust(left=0.005, right=0.995, top=0.995, bottom=0.005)
    return fig


if __name__ == "__main__":
    draw().savefig(OUT, dpi=160)
    print(OUT)
