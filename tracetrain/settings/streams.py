"""Settings of the Faust stream processors: rollout join, credit assignment, AIR rules."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tracetrain.modes import CreditMode, LatePolicy, OnOversize, OnTimeout


class AirRuleSettings(BaseModel):
    """Value of each automatic-intermediate-reward rule (0 disables a rule)."""

    # An AIR value is a reward: NaN or infinity would reach every transition it credits.
    model_config = ConfigDict(allow_inf_nan=False)

    tool_ok: float = Field(0.1, description="A tool span that returned normally.")
    tool_raised: float = Field(-0.5, description="A tool span that raised (status error / ok=false).")
    tool_timeout: float = Field(-0.5, description="A tool span whose error says it timed out.")
    nonzero_exit: float = Field(-0.5, description="A span with attribute exit_code != 0.")
    sql_error: float = Field(-0.5, description="A span with attribute db.error / sql.error set.")
    json_parse_failure: float = Field(
        -0.5, description="An LLM output meant to be JSON (attribute response_format) that fails to parse."
    )
    malformed_tool_call: float = Field(
        -0.5, description="Tool arguments that are not a JSON object, or unparseable llm.tool_calls."
    )
    timeout_pattern: str = Field(r"(?i)time[d ]?\s?out", description="Regex on a tool error message.")


class StreamsSettings(BaseModel):
    app_id: str = Field(
        "streams", description="Faust app id; the consumer group is '<topics.prefix>-<app_id>'."
    )
    web_host: str = "127.0.0.1"
    web_port: int = Field(6066, ge=1, le=65535, description="Faust web: /metrics, health.")
    start_timeout_s: float = Field(90.0, gt=0, description="`up` waits this long for the web server.")
    idle_timeout_s: float = Field(300.0, gt=0, description="A rollout with no events closes.")
    close_grace_s: float = Field(
        0.5, ge=0,
        description="A rollout with its final reward closes once its spans/air partition has been "
        "read this far (record time) past the reward and its last span, or, at the head of the log, "
        "once it has been quiet this long with nothing left to read; an end marker waits this long.",
    )
    timer_interval_s: float = Field(0.1, gt=0, description="How often closes/time-outs are checked.")
    on_timeout: OnTimeout = Field(
        "dlq", description="A timed-out rollout: to the DLQ, or emitted with the rewards seen so far."
    )
    max_record_bytes: int = Field(
        1_000_000, ge=16_384,
        description="The largest record the worker writes (its producer's max.request.size): a "
        "rollout's stored state, a kept call, a transition, a dead letter. Kafka refuses larger "
        "ones; keep it at or below the broker's message.max.bytes (1,048,588 by default) and "
        "the output topics' max.message.bytes. A kept call over it is dead-lettered "
        "(call_too_large), a rollout whose state outgrows it closes at once (`on_oversize`), "
        "a dead letter whose original value is over it is sent without the value.",
    )
    on_oversize: OnOversize = Field(
        "dlq", description="A rollout whose state outgrew max_record_bytes: to the DLQ (one "
        "summary, reason rollout_too_large) or emitted with the events so far.",
    )
    late_policy: LatePolicy = Field(
        "dlq", description="Events for a closed rollout: to the DLQ (reason late_event) or only counted."
    )
    closed_retention_s: float = Field(
        3600.0, gt=0, description="How long a closed rollout is remembered to recognise late events."
    )
    end_marker_attribute: str = Field(
        "tracetrain.rollout_end", description="A span attribute with value 'true' ends its rollout."
    )
    session_timeout_s: float = Field(
        30.0, gt=0, description="Consumer-group session: how soon a dead worker's partitions move."
    )
    fetch_max_wait_ms: int = Field(
        100, ge=1, le=30000,
        description="How long a worker's fetch waits at the broker for new records; bounds how "
        "long a partition just read waits to be read again (Faust's fixed 1500 ms showed up in "
        "reward-to-transition latency).",
    )
    retokenize: bool = Field(
        True, description="A selected LLM call recorded without token ids (OTLP, the OTel "
        "exporter) is tokenised from its recorded messages and response with the base model's "
        "tokenizer and chat template, loaded on first use (streams/retokenize.py); false: it "
        "goes to the DLQ as 'no token ids'.",
    )
    credit: CreditMode = "identical"
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    select_agents: str | None = Field(None, description="Regex of agent names to train; None: all.")
    select_models: str | None = Field(None, description="Regex of model names to train; None: all.")
    select_policies: str | None = Field(
        None, description="Regex of policy names to train; None: all (spans without one pass)."
    )
    air_rules: AirRuleSettings = AirRuleSettings()

    def group_id(self, prefix: str) -> str:
        return f"{prefix}-{self.app_id}"
