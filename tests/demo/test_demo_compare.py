"""`tracetrain demo --compare`: the picture and JSON line from summaries made by hand, and its
options refused before anything starts. No broker, engine or MLflow: the runs are stand-ins."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from demo import compare
from demo.monitor import HeldOut
from demo.report import heldout_point
from tracetrain.cli import app
from tracetrain.settings import Settings


def _summary(mode: str, base: float, checks: list[tuple[float, float]], final: float,
             versions: int) -> dict:
    """A run's summary as DemoRun writes it, trimmed to what a comparison reads."""
    return {"task": "calc", "mode": mode, "base_accuracy": base, "final_accuracy": final,
            "n": 200, "minutes": 16.5, "training_minutes": 14.25, "versions": versions,
            "heldout_per_version": [{"version": str(i + 1), "n": 32, "accuracy": acc,
                                     "at": 1000.0 + 60 * minutes, "minutes": minutes}
                                    for i, (minutes, acc) in enumerate(checks)]}


SUMMARIES = [_summary("rl", 0.145, [(2.5, 0.4), (6.0, 0.7)], 0.77, 9),
             _summary("sft", 0.145, [(3.0, 0.5)], 0.74, 14)]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_one_picture_and_the_json_line_of_every_mode(tmp_path):
    result = compare.save(SUMMARIES, tmp_path, stamp="20261206-120000")

    png = tmp_path / "compare-20261206-120000" / "compare.png"
    assert result["png"] == str(png)
    width, height = _png_size(png.read_bytes())
    assert (width, height) == (880, 495)  # 8 x 4.5 inches at 110 dpi
    assert png.stat().st_size > 10_000, "a picture with lines and a legend, not an empty frame"
    assert (tmp_path / "compare.png").read_bytes() == png.read_bytes()  # the newest
    assert result == {"png": str(png), "compare": {
        "rl": {"final_accuracy": 0.77, "base_accuracy": 0.145, "n": 200, "minutes": 16.5,
               "training_minutes": 14.25, "versions": 9},
        "sft": {"final_accuracy": 0.74, "base_accuracy": 0.145, "n": 200, "minutes": 16.5,
                "training_minutes": 14.25, "versions": 14}}}
    assert json.loads((png.parent / "compare.json").read_text()) == result


def test_runs_made_one_at_a_time_are_compared_from_their_summaries(tmp_path, capsys):
    paths = []
    for summary in SUMMARIES:
        paths.append(tmp_path / f"{summary['mode']}.json")
        paths[-1].write_text(json.dumps(summary))
    compare.main([*map(str, paths), "--out", str(tmp_path / "out")])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["compare"]["rl"]["final_accuracy"] == 0.77 and set(line["compare"]) == {"rl", "sft"}
    assert (tmp_path / "out" / "compare.png").read_bytes() == open(line["png"], "rb").read()
    with pytest.raises(SystemExit):
        compare.main([str(paths[0]), str(paths[0])])  # the same mode twice
    assert "one run per mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path / "nothing.json")])
    assert "no such summary" in capsys.readouterr().err


def test_a_mode_line_runs_from_the_base_through_its_checks_to_the_final():
    assert compare.curve(SUMMARIES[0]) == ([0.0, 2.5, 6.0, 14.25], [0.145, 0.4, 0.7, 0.77])
    without_checks = {**SUMMARIES[1], "heldout_per_version": []}
    assert compare.curve(without_checks) == ([0.0, 14.25], [0.145, 0.74])


def test_a_check_in_the_summary_carries_its_minutes_since_training_started():
    check = HeldOut("3", 32, 0.75, at=1090.0)
    assert heldout_point(check, started=1000.0) == {**asdict(check), "minutes": 1.5}


@pytest.mark.parametrize(("text", "named"), [
    ("rl,bogus", "'bogus'"), ("rl", "at least two"), ("rl,rl", "named twice"), ("rl,", "''")])
def test_modes_that_cannot_be_compared_are_named(text, named):
    with pytest.raises(ValueError, match=named):
        compare.parse_modes(text)


def test_modes_are_read_in_order_with_spaces_around_them():
    assert compare.parse_modes(" sft, rl ") == ("sft", "rl")


class _StandIn:
    """A DemoRun that starts nothing and returns a made-up summary of its mode."""
    made: list = []

    def __init__(self, settings, opts, console):
        self.opts = opts
        _StandIn.made.append(opts)

    def run(self) -> dict:
        return next(s for s in SUMMARIES if s["mode"] == self.opts.mode)


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """Demo runs and settings that record being asked for; the home is the test's folder."""
    asked: list[str] = []
    _StandIn.made = []

    def settings() -> Settings:
        asked.append("settings")
        return Settings(home=tmp_path)

    monkeypatch.setattr("tracetrain.settings.get_settings", settings)
    monkeypatch.setattr("demo.run.DemoRun", _StandIn)
    monkeypatch.setattr("demo.compare.DemoRun", _StandIn)
    return asked


@pytest.mark.parametrize(("args", "named"), [
    (["--compare", "rl,bogus"], "'bogus'"),
    (["--compare", "sft"], "at least two"),
    (["--mode", "rl", "--compare", "rl,sft"], "--mode or --compare"),
    (["--compare", "rl,sft", "--task", "sql", "--front-end", "autogen"], "'autogen'"),
    (["--lora-targets", "q_proj,mlp"], "'q_proj,mlp': expected 'all', 'attention' or module"),
    (["--lora-targets", ","], "',': expected"),
])
def test_compare_options_are_refused_before_anything_starts(stand_ins, args, named):
    out = CliRunner().invoke(app, ["demo", *args])
    text = " ".join(out.output.replace("│", " ").split())
    assert out.exit_code == 2 and named in text, out.output
    assert stand_ins == [] and _StandIn.made == [], "settings were built or a run started"


def test_compare_runs_each_mode_with_the_same_options_and_prints_the_line_last(stand_ins,
                                                                               tmp_path):
    out = CliRunner().invoke(app, ["demo", "--compare", "rl,sft", "--minutes", "3",
                                   "--workers", "4"])
    assert out.exit_code == 0, out.output
    assert [opts.mode for opts in _StandIn.made] == ["rl", "sft"]
    first, second = (asdict(opts) for opts in _StandIn.made)
    assert {k for k in first if first[k] != second[k]} == {"mode"}
    assert first["minutes"] == 3.0 and first["workers"] == 4
    last = json.loads(out.output.strip().splitlines()[-1])
    assert set(last["compare"]) == {"rl", "sft"} and last["compare"]["sft"]["versions"] == 14
    assert (tmp_path / "demo" / "compare.png").is_file()


@pytest.mark.parametrize(("given", "targets"), [
    (None, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    ("attention", ("q_proj", "v_proj")),
    ("v_proj, down_proj", ("v_proj", "down_proj")),
])
def test_the_demo_lora_reaches_the_learner_settings(stand_ins, given, targets):
    from demo.run import demo_settings
    from demo.tasks import get_task

    out = CliRunner().invoke(app, ["demo", "--compare", "rl,sft",
                                   *(["--lora-targets", given] if given else [])])
    assert out.exit_code == 0, out.output
    assert [opts.lora_targets for opts in _StandIn.made] == [targets, targets]
    opts = _StandIn.made[-1]
    settings = demo_settings(Settings(), opts, get_task("calc", "openai"), "run")
    assert settings.learner.lora_targets == list(targets)


def test_runs_of_two_modes_started_together_share_nothing(tmp_path):
    from rich.console import Console

    from demo.run import DemoOptions, DemoRun
    from serving.access import download_dir

    runs = [DemoRun(Settings(home=tmp_path), DemoOptions(mode=mode, n_eval=4), Console(quiet=True))
            for mode in ("rl", "sft")]
    first, second = runs
    assert first.folder != second.folder
    assert first.settings.topics.prefix != second.settings.topics.prefix
    assert first.settings.mlflow.registered_model != second.settings.mlflow.registered_model
    # each run's versions are its own: version numbers restart at 1 in every registered model
    for run in runs:
        assert download_dir(run.settings) == (run.folder / "versions").resolve()


def test_the_calc_demo_rehearses_other_worked_problems_than_its_warm_start(tmp_path):
    from rich.console import Console

    from demo.run import DemoOptions, DemoRun, rehearsal_file, warm_start_file
    from learner.warm_start import read_demonstrations

    run = DemoRun(Settings(home=tmp_path), DemoOptions(), Console(quiet=True))
    learner = run.settings.learner
    assert learner.rehearsal == rehearsal_file(Settings(home=tmp_path), run.run_id)
    assert learner.rehearsal_per_step == 4
    rehearsed = {json.dumps(d) for d in read_demonstrations(learner.rehearsal)}
    warm = {json.dumps(d) for d in read_demonstrations(warm_start_file(Settings(home=tmp_path),
                                                                       run.run_id))}
    assert len(rehearsed) == 600 and not rehearsed & warm  # 300 problems, two calls each
    off = DemoRun(Settings(home=tmp_path / "off"), DemoOptions(rehearsal=0), Console(quiet=True))
    assert off.settings.learner.rehearsal is None
    assert not rehearsal_file(Settings(home=tmp_path / "off"), off.run_id).exists()


def test_the_calc_demo_works_its_problems_in_the_style_asked(tmp_path):
    """--calc-style steps: the warm start's demonstrations compute one operation a call, under
    the steps prompt, and the agents the run builds solve in that style."""
    from rich.console import Console

    from demo.run import WARM_START_SEED, DemoOptions, DemoRun, warm_start_file
    from examples.calc.agent import STEPS_PROMPT, steps
    from examples.calc.problems import generate
    from learner.warm_start import read_demonstrations

    run = DemoRun(Settings(home=tmp_path), DemoOptions(calc_style="steps", warm_start=10,
                                                       rehearsal=0), Console(quiet=True))
    demos = read_demonstrations(warm_start_file(Settings(home=tmp_path), run.run_id))
    problems = generate(10, WARM_START_SEED, split="train")
    assert len(demos) == sum(len(steps(p.expression)) + 1 for p in problems)
    assert all(prompt[0]["content"] == STEPS_PROMPT for prompt, _ in demos)
    agent = run.task.agent("http://127.0.0.1:9/v1")
    assert agent.style == "steps" and agent.max_turns == 5


def test_the_calc_warm_start_is_longer_where_the_learner_shares_the_prompt():
    """sft, and rl's warm start, run a batch's shared prompt once (learner/shared_prefix.py):
    1300 worked problems fit their 30 minutes; kto's loss runs every row whole, so it takes 450."""
    from demo.run import DemoOptions

    assert DemoOptions().warm_start_problems == 1300
    assert DemoOptions(mode="rl").warm_start_problems == 1300
    assert DemoOptions(mode="kto").warm_start_problems == 450
    assert DemoOptions(mode="rl", warm_start=700).warm_start_problems == 700  # as asked
    assert DemoOptions(task="sql").warm_start_problems == 0
    # a comparison starts every mode from the same worked problems
    from demo.compare import same_warm_start

    assert same_warm_start(DemoOptions(), ("rl", "sft")).warm_start == 1300
    assert same_warm_start(DemoOptions(), ("kto", "sft")).warm_start == 450
    assert same_warm_start(DemoOptions(warm_start=900), ("rl", "sft")).warm_start == 900


def test_the_traffic_ends_early_only_where_the_run_would_overrun_its_minutes():
    """Run 24 took 31.3 minutes: a slow hour stretched its warm start to 13.9. The traffic now
    gives way to the finish (FINISH_RESERVE_S), and never starts before it started."""
    from demo.run import FINISH_RESERVE_S, DemoOptions, traffic_ends_at

    t0, opts = 1000.0, DemoOptions(within=30)  # 10 minutes of traffic
    # a quick start: the whole 10 minutes
    assert traffic_ends_at(t0, t0 + 15 * 60, opts) == t0 + 25 * 60
    # a slow one: cut so that the finish still fits in 30 minutes
    cut = traffic_ends_at(t0, t0 + 18 * 60, opts)
    assert cut == t0 + 30 * 60 - FINISH_RESERVE_S < t0 + 28 * 60
    # no time left at all: no traffic, rather than an end before its start
    assert traffic_ends_at(t0, t0 + 29 * 60, opts) == t0 + 29 * 60
    # without a bound, or with a loose one, the traffic runs its minutes
    assert traffic_ends_at(t0, t0 + 18 * 60, DemoOptions(within=None)) == t0 + 28 * 60
    assert traffic_ends_at(t0, t0 + 18 * 60, DemoOptions(within=60)) == t0 + 28 * 60


def test_the_cli_bounds_the_default_run_and_leaves_asked_for_minutes_alone():
    from demo.cli import _within

    assert _within(None, 10.0) == 30.0  # `tracetrain demo`: the 30-minute promise
    assert _within(None, 60.0) is None  # `--minutes 60`: its 60 minutes of traffic
    assert _within(45.0, 60.0) == 45.0 and _within(0.0, 10.0) is None
