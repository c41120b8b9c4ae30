"""Each mode's allowed values are defined once (tracetrain.modes) and the settings use them."""

from __future__ import annotations

from tracetrain import modes
from tracetrain.settings.learner import LearnerSettings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings
from tracetrain.settings.streams import StreamsSettings


def test_settings_fields_are_the_mode_aliases():
    uses = {(LearnerSettings, "mode"): modes.LearnerMode,
            (LearnerSettings, "advantage"): modes.AdvantageMode,
            (LearnerSettings, "loss_type"): modes.LossType,
            (LearnerSettings, "staleness_policy"): modes.StalenessPolicy,
            (StreamsSettings, "credit"): modes.CreditMode,
            (StreamsSettings, "on_timeout"): modes.OnTimeout,
            (StreamsSettings, "late_policy"): modes.LatePolicy,
            (EngineSettings, "backend"): modes.EngineBackend,
            (ReloaderSettings, "alias"): modes.RegistryAlias}
    for (section, field), alias in uses.items():
        assert section.model_fields[field].annotation == alias, f"{section.__name__}.{field}"


def test_values_and_their_wording():
    assert modes.LEARNER_MODES == ("rl", "sft", "kto")
    assert modes.CREDIT_MODES == ("identical", "air", "discounted")
    assert modes.one_of(modes.LEARNER_MODES) == "rl, sft or kto"
    assert modes.one_of(("only",)) == "only"
